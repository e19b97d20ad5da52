//! The shared-memory ring as the agent receives it from a consumer it cannot trust: the
//! handshake message and its descriptors (`RingOffer::receive`, as `dquant-agent`'s Unix
//! socket reads it), then the memfd's header (`RingProducer::attach` / `RingOffer::accept`,
//! which map the file and validate its `Meta`), then the first batch the agent writes into
//! it (`BatchSink::reserve`/`commit` as the produce loop calls them).
//!
//! Checked against an independent reading of the layout table in `ring::layout`:
//!
//! * an offer is taken exactly when it is a tag (a session's, or a shared-stream
//!   subscriber's), then a valid hello, with three descriptors;
//! * a ring is attached exactly when its memfd is sealed against shrinking and its header
//!   describes exactly the file it is in; the attached layout is that description, and the
//!   header re-encodes (`Layout::meta`) to the bytes it came from;
//! * a slot is handed out exactly when the consumer has not closed and the header's indices
//!   leave room; it is `slot_size` bytes inside the file (its ends are written), and
//!   committing writes the completion record (sequence, length, crc32c when the ring asks for
//!   it) and moves the producer index on by one.
//!
//! Input: flags (seals, descriptors to send, direct attach or offer), the file length, the
//! length of the batch to commit, the handshake message (length-prefixed), then the file's
//! first bytes (the rest of the file is zeros).
#![no_main]

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use dquant_fuzz::ring::{eventfd, expected_layout, head, ring_memfd, u32_at, u64_at};
use dquant_transport::ring::layout::{self, Layout, CONSUMER_CLOSED, FLAG_CRC};
use dquant_transport::ring::{
    send_fds, RingError, RingFds, RingProducer, HANDSHAKE, HANDSHAKE_SHARED,
};
use dquant_transport::shm::{OfferError, RingOffer};
use dquant_transport::sink::BatchSink;
use dquant_transport::Hello;
use libfuzzer_sys::fuzz_target;

/// Files up to 64 MiB: larger ones are only more zero pages, and a slot's crc32c reads all of
/// a committed batch.
const MAX_FILE: u64 = 64 << 20;

/// The first 56 bytes of a header (its `Meta`, to the reader count).
fn meta_bytes(l: &Layout, flags: u32) -> Vec<u8> {
    let m = l.meta(flags);
    let mut b = Vec::new();
    b.extend_from_slice(&m.magic.to_le_bytes());
    b.extend_from_slice(&m.version.to_le_bytes());
    b.extend_from_slice(&m.slot_count.to_le_bytes());
    for v in [m.slot_size, m.records_offset, m.slots_offset, m.total_len] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&m.flags.to_le_bytes());
    b.extend_from_slice(&m.readers.to_le_bytes());
    b
}

fn pread(fd: &OwnedFd, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    let n = rustix::io::pread(fd, &mut b, at).expect("pread of the ring file");
    assert_eq!(n, len);
    b
}

/// What the test knows of the file it made.
struct File {
    fd: OwnedFd,
    len: u64,
    head: Vec<u8>,
    sealed: bool,
}

impl File {
    fn make(len: u64, contents: &[u8], seals: u8) -> File {
        let sealed = seals & 1 != 0;
        let (fd, written) = ring_memfd(len, contents, sealed);
        File {
            fd,
            len,
            head: head(written, 448),
            sealed,
        }
    }

    fn fds(&self) -> RingFds {
        RingFds {
            memfd: self.fd.try_clone().expect("dup"),
            consumer_wake: eventfd(),
            producer_wake: eventfd(),
        }
    }

    /// The attach must succeed exactly when this is `Some`.
    fn expected(&self) -> Option<(u32, u64, u64)> {
        // A session's ring: one reader block.
        expected_layout(&self.head, self.len)
            .filter(|shape| self.sealed && shape.readers == 1)
            .map(|shape| (shape.slots, shape.slot_size, shape.slots_offset))
    }

    /// Whether the producer may have a slot now, from the header's indices and flags.
    fn room(&self, n: u32) -> bool {
        // The producer index, and reader 0's consumer index and closed flags.
        let (p, c) = (u64_at(&self.head, 64), u64_at(&self.head, 192));
        u32_at(&self.head, 320) & CONSUMER_CLOSED == 0 && p.wrapping_sub(c) < u64::from(n)
    }

    fn check_layout(&self, l: &Layout) {
        let (n, size, slots_offset) = self.expected().expect("attached a ring the table refuses");
        assert_eq!(
            (l.slot_count, l.slot_size, l.slots_offset),
            (n, size, slots_offset)
        );
        assert_eq!(l.total_len, self.len);
        assert_eq!(meta_bytes(l, u32_at(&self.head, 48)), self.head[..56]);
        assert_eq!(l.record_offset(n - 1) + 16, 448 + 16 * u64::from(n));
        assert!(l.record_offset(n - 1) + 16 <= l.slots_offset);
        assert_eq!(l.slot_offset(n - 1) + l.slot_size, l.total_len);
    }

    /// After a commit of `len` bytes (each byte `i as u8`): the completion record and index.
    fn check_published(&self, n: u32, len: usize) {
        let p = u64_at(&self.head, 64);
        let l = Layout::new(n, u64_at(&self.head, 16)).expect("checked layout");
        let index = (p % u64::from(n)) as u32;
        let rec = pread(&self.fd, l.record_offset(index), 16);
        assert_eq!(u64_at(&rec, 0), p, "completion record's sequence");
        assert_eq!(u32_at(&rec, 8) as usize, len, "completion record's length");
        let data = pread(&self.fd, l.slot_offset(index), len);
        assert!(data.iter().enumerate().all(|(i, &b)| b == i as u8));
        let crc = if u32_at(&self.head, 48) & FLAG_CRC != 0 {
            crc32c::crc32c(&data)
        } else {
            0
        };
        assert_eq!(u32_at(&rec, 12), crc, "completion record's crc32c");
        let index_now = u64_at(&pread(&self.fd, 64, 8), 0);
        assert_eq!(
            index_now,
            p.wrapping_add(1),
            "producer index after one commit"
        );
    }
}

fn fill(slot: &mut [u8], len: usize) {
    for (i, b) in slot[..len].iter_mut().enumerate() {
        *b = i as u8;
    }
}

/// The agent's own producer, as `RingProducer::attach` gives it.
fn direct(f: &File, commit_len: usize) {
    let mut p = match RingProducer::attach(f.fds()) {
        Ok(p) => p,
        Err(e) => {
            assert!(f.expected().is_none(), "a valid ring was refused: {e}");
            if !f.sealed {
                assert!(matches!(e, RingError::NotSealed(_)), "{e}");
            }
            return;
        }
    };
    f.check_layout(p.layout());
    let n = p.layout().slot_count;
    let size = p.layout().slot_size;
    match p.reserve_timeout(Duration::ZERO) {
        Ok(mut slot) => {
            assert!(f.room(n));
            assert_eq!(slot.len() as u64, size);
            // Both ends of the slot are inside the mapping.
            slot[0] = 0;
            let last = slot.len() - 1;
            slot[last] = 0;
            if commit_len as u64 > size {
                assert!(matches!(
                    slot.commit(commit_len),
                    Err(RingError::TooLarge { .. })
                ));
                return;
            }
            fill(&mut slot, commit_len);
            slot.commit(commit_len).expect("a commit within the slot");
            f.check_published(n, commit_len);
        }
        Err(RingError::ConsumerGone) => assert_ne!(u32_at(&f.head, 320) & CONSUMER_CLOSED, 0),
        Err(RingError::Timeout(_)) => {
            assert_eq!(u32_at(&f.head, 320) & CONSUMER_CLOSED, 0);
            assert!(!f.room(n));
        }
        Err(e) => panic!("reserve: {e}"),
    }
}

/// The agent's Unix socket path: the offer, then the sink the produce loop writes to.
fn offered(f: &File, msg: &[u8], nfds: usize, commit_len: usize) {
    let (client, agent) = UnixStream::pair().expect("socketpair");
    let fds = f.fds();
    let all = [
        fds.memfd.as_fd(),
        fds.consumer_wake.as_fd(),
        fds.producer_wake.as_fd(),
    ];
    if nfds == 0 {
        (&client).write_all(msg).expect("send the offer");
    } else {
        send_fds(&client, &all[..nfds], msg).expect("send the offer");
    }
    drop(fds);
    let tagged = msg
        .strip_prefix(HANDSHAKE)
        .or_else(|| msg.strip_prefix(HANDSHAKE_SHARED));
    let hello = tagged.and_then(|rest| Hello::parse(rest).ok());
    let offer = match RingOffer::receive(&agent) {
        Ok(o) => o,
        Err(e) => {
            assert!(
                hello.is_none() || nfds != 3,
                "a valid offer was refused: {e}"
            );
            if tagged.is_none() {
                assert!(
                    matches!(e, OfferError::Ring(RingError::Handshake(_))),
                    "{e}"
                );
            }
            return;
        }
    };
    assert_eq!(nfds, 3);
    assert_eq!(Some(offer.hello.clone()), hello);
    assert_eq!(offer.shared, msg.starts_with(HANDSHAKE_SHARED));
    let sock = agent.try_clone().expect("dup");
    let mut sink = match offer.accept(sock, Arc::new(AtomicBool::new(false))) {
        Ok(s) => s,
        Err(e) => {
            assert!(f.expected().is_none(), "a valid ring was refused: {e}");
            return;
        }
    };
    let l = *sink.layout().expect("an open sink has a layout");
    f.check_layout(&l);
    assert_eq!(sink.max_record_len(), usize::try_from(l.slot_size).ok());
    // A full ring makes `reserve` wait for the consumer (the agent's back-pressure); only
    // a ring with room is written.
    if !f.room(l.slot_count) {
        return;
    }
    match sink.reserve(commit_len) {
        Ok(room) => {
            assert!(commit_len as u64 <= l.slot_size);
            assert_eq!(room.len(), commit_len);
            fill(room, commit_len);
            sink.commit(commit_len).expect("commit");
            f.check_published(l.slot_count, commit_len);
        }
        Err(e) => assert!(commit_len as u64 > l.slot_size, "reserve: {e}"),
    }
    sink.finish().expect("finish");
    let closed = u32_at(&pread(&f.fd, 320, 4), 0);
    assert_ne!(closed & layout::PRODUCER_CLOSED, 0);
}

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let flags = head[0];
    let file_len =
        u64::from(u32::from_le_bytes([head[1], head[2], head[3], head[4]])) % (MAX_FILE + 1);
    let commit_len = usize::from(u16::from_le_bytes([head[5], head[6]]));
    let msg_len = usize::from(head[7]).min(rest.len());
    let (msg, contents) = rest.split_at(msg_len);
    let f = File::make(file_len, contents, flags);
    if msg.is_empty() {
        direct(&f, commit_len);
    } else {
        offered(&f, msg, usize::from(flags >> 1) % 4, commit_len);
    }
});
