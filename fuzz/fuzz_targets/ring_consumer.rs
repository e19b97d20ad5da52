//! The shared-memory ring as a consumer (the host) reads it from an agent it cannot trust:
//! `RingSource` over a `RingConsumer` checks each completion record (sequence, length,
//! crc32c), the batch record in the slot (`BatchHeader`, its length) and hands views out in
//! place, keeps them while the caller does, and detaches long-kept ones (`mremap`).
//!
//! The input is a script of steps over one small ring: the real producer publishes a batch
//! (`RingProducer`, as the agent does), the consumer takes the next one (and keeps its view
//! or copies its payload out), a kept view is dropped, the producer closes or goes away, and
//! a hostile producer writes any bytes anywhere in the shared file (header, indices, flags,
//! completion records, slots).
//!
//! Checked: nothing the producer writes makes the consumer fault, hang or panic; every
//! record handed out is a whole `BatchHeader` and exactly its payload. As long as the
//! producer has followed the protocol (no stray write yet), the consumer hands out exactly
//! the batches published, in order, each kept view reads the bytes it was published with
//! until it is dropped (also after it was detached and its slot reused), and the stream ends
//! as the producer ended it.
#![no_main]

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use dquant_codec::Codec;
use dquant_transport::receive::{BatchSource, ReceiveError, RecordView};
use dquant_transport::record::RECORD_HEADER_LEN;
use dquant_transport::ring::{RingConsumer, RingFds, RingProducer};
use dquant_transport::shm::RingSource;
use dquant_transport::BatchHeader;
use libfuzzer_sys::fuzz_target;

/// The fuzzer's bytes, consumed as the script goes; zeros once they run out.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

/// How the producer left the stream.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    Open,
    Closed,
    Aborted,
}

struct Run {
    src: RingSource,
    producer: Option<RingProducer>,
    /// The shared file, as the producer's process can write it.
    memfd: OwnedFd,
    file_len: u64,
    slot_size: usize,
    /// Batches published and not yet taken (protocol-following runs only).
    published: VecDeque<Vec<u8>>,
    /// Views kept, with the bytes they were taken with.
    kept: Vec<(RecordView, Vec<u8>)>,
    end: End,
    /// Whether the producer has written outside the protocol: from then on only safety is
    /// checked, not what arrives.
    hostile: bool,
    /// Whether the consumer has seen the end or an error (a reader stops there).
    done: bool,
}

impl Run {
    fn new(s: &mut Script<'_>) -> Option<Run> {
        let shape = s.u8();
        let slots = 1 + u32::from(shape & 3);
        // Page-sized slots can be detached; 200-byte ones cannot, and views may pin them all.
        let slot_size = if shape & 4 != 0 { 4096 } else { 200 };
        let (ring, fds) = RingConsumer::create_with(slots, slot_size, shape & 8 != 0).ok()?;
        let memfd = fds.memfd.try_clone().ok()?;
        let file_len = ring.layout().total_len;
        let producer = RingProducer::attach(RingFds {
            memfd: fds.memfd,
            consumer_wake: fds.consumer_wake,
            producer_wake: fds.producer_wake,
        })
        .expect("a ring made here attaches");
        // The agent's end of the socket is gone at once: a consumer that reports the producer
        // gone reads the error message there, and finds none without waiting.
        let (sock, _agent) = UnixStream::pair().ok()?;
        Some(Run {
            src: RingSource::new(ring, sock),
            producer: Some(producer),
            memfd,
            file_len,
            slot_size: slot_size as usize,
            published: VecDeque::new(),
            kept: Vec::new(),
            end: End::Open,
            hostile: false,
            done: false,
        })
    }

    /// The producer publishes a batch of `len` bytes, a well-formed record or the script's
    /// bytes as they are.
    fn publish(&mut self, s: &mut Script<'_>) {
        let len = usize::from(s.u16()) % (self.slot_size + 1);
        let well_formed = s.u8() & 1 == 0;
        let mut rec = s.bytes(len).to_vec();
        rec.resize(len, 0xa5);
        if well_formed && len >= RECORD_HEADER_LEN {
            let h = BatchHeader {
                codec: Codec::plain(dquant_codec::Width::U8),
                index: self.published.len() as u64,
                samples: 1,
                sample_len: (len - RECORD_HEADER_LEN) as u32,
                payload_len: (len - RECORD_HEADER_LEN) as u32,
                trailer_len: 0,
                cursor_epoch: 0,
                cursor_consumed: 1,
            };
            rec[..RECORD_HEADER_LEN].copy_from_slice(&h.encode());
        }
        let Some(p) = self.producer.as_mut() else {
            return;
        };
        let Ok(mut slot) = p.reserve_timeout(Duration::ZERO) else {
            // Full (views pin every slot), or the consumer closed.
            return;
        };
        slot[..len].copy_from_slice(&rec);
        slot.commit(len).expect("a batch within the slot");
        self.published.push_back(rec);
    }

    /// The consumer takes the next record, if one is at hand.
    fn take(&mut self, s: &mut Script<'_>) {
        let how = s.u8();
        if self.done {
            return;
        }
        let ready = match self.src.wait_ready(Duration::ZERO) {
            Ok(r) => r,
            Err(e) => return self.failed(e),
        };
        if !ready {
            // Nothing published, and the producer neither ended nor went away.
            if !self.hostile {
                assert!(self.published.is_empty(), "a published batch was not ready");
                assert_eq!(self.end, End::Open);
            }
            return;
        }
        let h = match self.src.next_header() {
            Ok(Some(h)) => h,
            Ok(None) => {
                if !self.hostile {
                    assert!(
                        self.published.is_empty(),
                        "the stream ended before its batches"
                    );
                    assert_eq!(self.end, End::Closed);
                }
                self.done = true;
                return;
            }
            Err(e) => return self.failed(e),
        };
        let want = if self.hostile {
            None
        } else {
            Some(
                self.published
                    .pop_front()
                    .expect("a batch came that was not published"),
            )
        };
        let len = RECORD_HEADER_LEN + h.payload_len as usize;
        if how & 1 == 0 {
            let v = self
                .src
                .take_record()
                .expect("a ring record is kept in place");
            assert_eq!(v.len(), len);
            let head: &[u8; RECORD_HEADER_LEN] = v[..RECORD_HEADER_LEN].try_into().unwrap();
            assert_eq!(BatchHeader::parse(head).ok(), Some(h));
            if let Some(w) = want {
                assert_eq!(&v[..], &w[..]);
            }
            if how & 2 == 0 {
                let bytes = v.to_vec();
                self.kept.push((v, bytes));
            }
        } else {
            let mut payload = vec![0u8; h.payload_len as usize];
            self.src
                .read_payload(&mut payload)
                .expect("the payload of the record taken");
            if let Some(w) = want {
                assert_eq!(payload, w[RECORD_HEADER_LEN..]);
            }
        }
    }

    fn failed(&mut self, e: ReceiveError) {
        self.done = true;
        if self.hostile {
            return;
        }
        match e {
            // A record that is not a batch record: only what the producer published.
            ReceiveError::Wire(_) | ReceiveError::Transport(_)
                if self.published.front().is_some_and(|r| !well_formed(r)) => {}
            ReceiveError::Producer(_) if self.end == End::Aborted => {
                assert!(self.published.is_empty(), "batches lost behind an abort");
            }
            // Views pin every slot of a ring that cannot detach.
            ReceiveError::Transport(m) if m.contains("live views hold all") => {
                assert_eq!(self.slot_size, 200, "a ring of page-sized slots detaches");
            }
            e => panic!("a protocol-following producer gave the consumer: {e}"),
        }
    }

    /// A hostile producer writes the script's bytes anywhere in the file.
    fn scribble(&mut self, s: &mut Script<'_>) {
        let at = u64::from(s.u16()) % self.file_len;
        let n = usize::from(s.u8() % 17);
        let b = s.bytes(n).to_vec();
        let b = &b[..b.len().min((self.file_len - at) as usize)];
        rustix::io::pwrite(&self.memfd, b, at).expect("pwrite to the ring file");
        self.hostile = true;
    }

    fn check_kept(&self) {
        if self.hostile {
            return;
        }
        for (v, bytes) in &self.kept {
            assert_eq!(&v[..], &bytes[..], "a kept view changed under its reader");
        }
    }
}

/// Whether a published record is one `RingSource` accepts: a header and exactly its payload.
fn well_formed(r: &[u8]) -> bool {
    r.first_chunk::<RECORD_HEADER_LEN>()
        .and_then(|h| BatchHeader::parse(h).ok())
        .is_some_and(|h| RECORD_HEADER_LEN + h.payload_len as usize == r.len())
}

fuzz_target!(|data: &[u8]| {
    let mut s = Script(data);
    let Some(mut run) = Run::new(&mut s) else {
        return;
    };
    // A script of a few KiB has a few hundred steps at most.
    for _ in 0..512 {
        if s.0.is_empty() {
            break;
        }
        match s.u8() % 8 {
            0 | 1 => run.publish(&mut s),
            2 | 3 => run.take(&mut s),
            4 => {
                let i = usize::from(s.u8());
                if !run.kept.is_empty() {
                    let i = i % run.kept.len();
                    run.kept.swap_remove(i);
                }
            }
            5 => {
                if let Some(p) = run.producer.take() {
                    if s.u8() & 1 == 0 {
                        p.close();
                        run.end = End::Closed;
                    } else {
                        drop(p);
                        run.end = End::Aborted;
                    }
                }
            }
            6 => {
                if let Err(e) = run.src.make_room() {
                    run.failed(e);
                }
            }
            _ => run.scribble(&mut s),
        }
        run.check_kept();
    }
});
