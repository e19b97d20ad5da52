//! Setting a ring up between two processes. The host creates the memfd, sizes it and seals it
//! so that it can never shrink under the agent's mapping, writes the layout into its header
//! and makes the two eventfds; [`RingFds`] carries the three descriptors over a Unix socket
//! in one message that starts with the [`HANDSHAKE`] tag (and may carry the bytes that
//! authorise the ring); [`RingProducer::attach`] checks the seals and the header against the
//! file before the agent writes anything.
//!
//! A shared stream's ring goes the other way: the agent creates it
//! ([`RingProducer::create`]) with a block per reader, adds a reader for each subscriber on
//! the host ([`RingProducer::add_reader`]) and sends it its descriptors and block as the
//! answer to the subscriber's own offer ([`Answer`]); the subscriber attaches
//! ([`RingConsumer::attach`]) after the same checks.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::{MemfdFlags, SealFlags};

use super::fdpass::{recv_fds, send_fds};
use super::layout::{self, Header, Layout, LayoutError, CONSUMER_CLOSED};
use super::memory::{ConsumerMem, Map};
use super::producer::Reader;
use super::wake::new_eventfd;
use super::{io_err, RingConsumer, RingError, RingProducer};

/// The three descriptors that make a ring: the memfd and the two wakeup eventfds.
#[derive(Debug)]
pub struct RingFds {
    pub memfd: OwnedFd,
    /// Written by the producer to wake a sleeping consumer.
    pub consumer_wake: OwnedFd,
    /// Written by the consumer to wake a producer waiting for a free slot.
    pub producer_wake: OwnedFd,
}

impl RingConsumer {
    /// Creates a sealed memfd ring of `slots` slots of `slot_size` bytes (see
    /// [`layout::DEFAULT_SLOT_SIZE`]) and its eventfds. Returns the consumer and duplicates of
    /// the descriptors for the producer.
    pub fn create(slots: u32, slot_size: u64) -> Result<(RingConsumer, RingFds), RingError> {
        Self::create_with(slots, slot_size, true)
    }

    /// As [`create`](RingConsumer::create), choosing whether batches carry a crc32c that
    /// this side checks (`checksums`).
    ///
    /// Checksums cost both sides a pass over every byte, about 0.05 CPU-s/GB each: the
    /// producer's core is busy writing batches, and a consumer that hands batches on without
    /// reading them (a GPU copy) would otherwise never touch them. The sequence number and
    /// length of each batch are checked either way, and the publish protocol alone already
    /// rules out torn batches; a crc guards against a buggy or hostile producer, and against
    /// memory corruption, not against the transport.
    pub fn create_with(
        slots: u32,
        slot_size: u64,
        checksums: bool,
    ) -> Result<(RingConsumer, RingFds), RingError> {
        let layout = Layout::new(slots, slot_size)?;
        let (memfd, file) = new_ring_file(&layout, checksums)?;
        let consumer_wake = new_eventfd()?;
        let producer_wake = new_eventfd()?;
        let fds = RingFds {
            memfd: dup(&memfd)?,
            consumer_wake: dup(&consumer_wake)?,
            producer_wake: dup(&producer_wake)?,
        };
        let fds_here = RingFds {
            memfd,
            consumer_wake,
            producer_wake,
        };
        Ok((consumer_of(file, layout, 0, fds_here, checksums), fds))
    }

    /// Maps reader `reader` of a ring an agent created and shared ([`RingProducer::create`],
    /// received with [`Answer::recv`]). Trusts nothing: the memfd must be sealed against
    /// shrinking, the header must describe exactly the file it is in, and the block must be
    /// one of its readers'. Batches are read from the block's consumer index on, and their
    /// crc32c checked when `verify` and the ring carries them.
    pub fn attach(fds: RingFds, reader: u32, verify: bool) -> Result<RingConsumer, RingError> {
        let (file, layout, meta) = map_checked(&fds.memfd)?;
        if reader >= layout.readers {
            return Err(RingError::Handshake(format!(
                "reader {reader} of a ring with {} reader blocks",
                layout.readers
            )));
        }
        let verify = verify && meta.flags & layout::FLAG_CRC != 0;
        let mut consumer = consumer_of(file, layout, reader, fds, verify);
        consumer.shared = true;
        let start = consumer.mem.lines().consumer.0.load(Ordering::Acquire);
        if start > layout::MAX_INDEX {
            return Err(RingError::Handshake(format!(
                "reader {reader}'s consumer index is {start}, past the {} a ring can count to",
                layout::MAX_INDEX
            )));
        }
        (consumer.read, consumer.tail) = (start, start);
        Ok(consumer)
    }
}

/// A sealed memfd of `layout`'s size, its header written, mapped.
fn new_ring_file(layout: &Layout, checksums: bool) -> Result<(OwnedFd, Map), RingError> {
    let memfd = rustix::fs::memfd_create(
        "dquant-ring",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(io_err("memfd_create"))?;
    rustix::fs::ftruncate(&memfd, layout.total_len).map_err(io_err("ftruncate"))?;
    rustix::fs::fcntl_add_seals(
        &memfd,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
    )
    .map_err(io_err("fcntl(F_ADD_SEALS)"))?;
    let file = Map::new(&memfd, 0, layout.total_len)?;
    let flags = if checksums { layout::FLAG_CRC } else { 0 };
    // SAFETY: the mapping is fresh, zero-filled, page aligned and nobody else has it yet;
    // `Meta` is plain data at offset 0.
    unsafe {
        file.ptr
            .as_ptr()
            .cast::<layout::Meta>()
            .write(layout.meta(flags))
    };
    Ok((memfd, file))
}

/// Maps a peer's ring file after checking its seals and header.
fn map_checked(memfd: &OwnedFd) -> Result<(Map, Layout, layout::Meta), RingError> {
    let seals = rustix::fs::fcntl_get_seals(memfd).map_err(io_err("fcntl(F_GET_SEALS)"))?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(RingError::NotSealed(seals));
    }
    let stat = rustix::fs::fstat(memfd).map_err(io_err("fstat"))?;
    let file_len = u64::try_from(stat.st_size).unwrap_or(0);
    if file_len < std::mem::size_of::<Header>() as u64 {
        return Err(LayoutError::TooSmall(file_len).into());
    }
    let map = Map::new(memfd, 0, file_len)?;
    // SAFETY: the mapping holds at least a header (checked above); `Meta` is plain data,
    // copied out once and validated before anything else is read.
    let meta = unsafe { map.ptr.as_ptr().cast::<layout::Meta>().read_volatile() };
    let layout = Layout::validate(&meta, file_len)?;
    Ok((map, layout, meta))
}

/// The consumer of reader block `reader` of `file`, from its start.
fn consumer_of(file: Map, layout: Layout, reader: u32, fds: RingFds, verify: bool) -> RingConsumer {
    let slots = layout.slot_count;
    let hold_limit = if layout.slot_size.is_multiple_of(layout::PAGE) {
        u64::from((slots / 2).max(1))
    } else {
        u64::from(slots)
    };
    let mem = ConsumerMem {
        file,
        layout,
        reader,
        memfd: fds.memfd,
        slots: Mutex::new((0..slots).map(|_| None).collect()),
        state: (0..slots).map(|_| AtomicU64::new(0)).collect(),
        detached: Mutex::new(HashMap::new()),
    };
    RingConsumer {
        mem: Arc::new(mem),
        consumer_wake: fds.consumer_wake,
        producer_wake: fds.producer_wake,
        peer: None,
        read: 0,
        tail: 0,
        verify,
        batch_wakeups: (slots / 2).max(1),
        slow_producer: std::cell::Cell::new(false),
        hold_limit,
        detached: 0,
        shared: false,
    }
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, RingError> {
    fd.try_clone()
        .map_err(|source| RingError::Io { op: "dup", source })
}

/// Every fd handshake starts with this tag (a listener can tell it from other protocols on
/// the same socket by its first bytes).
pub const HANDSHAKE: &[u8] = b"dquant-ring/1";

/// The tag of a shared-stream subscriber's offer: the same as [`HANDSHAKE`], but the
/// subscriber also takes a reader block of the stream's shared ring instead, and waits for the
/// agent's [`Answer`] to know which it reads.
pub const HANDSHAKE_SHARED: &[u8] = b"dquant-ring/s";

const _: () =
    assert!(HANDSHAKE.len() == HANDSHAKE_SHARED.len() && HANDSHAKE[0] == HANDSHAKE_SHARED[0]);

/// Most bytes a handshake may carry after the tag.
pub const MAX_HANDSHAKE_EXTRA: usize = 240;

impl RingFds {
    /// Sends the three descriptors over `sock` (SCM_RIGHTS) with the tag.
    pub fn send(&self, sock: &std::os::unix::net::UnixStream) -> Result<(), RingError> {
        self.send_with(sock, &[])
    }

    /// As [`send`](RingFds::send), with `extra` bytes after the tag in the same message (at
    /// most [`MAX_HANDSHAKE_EXTRA`]): e.g. the session and ticket that authorise the ring.
    pub fn send_with(
        &self,
        sock: &std::os::unix::net::UnixStream,
        extra: &[u8],
    ) -> Result<(), RingError> {
        self.send_tagged(sock, HANDSHAKE, extra)
    }

    /// As [`send_with`](RingFds::send_with), tagged `tag` ([`HANDSHAKE`] or
    /// [`HANDSHAKE_SHARED`]).
    pub fn send_tagged(
        &self,
        sock: &std::os::unix::net::UnixStream,
        tag: &[u8],
        extra: &[u8],
    ) -> Result<(), RingError> {
        if extra.len() > MAX_HANDSHAKE_EXTRA {
            return Err(RingError::Handshake(format!(
                "{} extra bytes, at most {MAX_HANDSHAKE_EXTRA}",
                extra.len()
            )));
        }
        let msg = [tag, extra].concat();
        send_fds(
            sock,
            &[
                self.memfd.as_fd(),
                self.consumer_wake.as_fd(),
                self.producer_wake.as_fd(),
            ],
            &msg,
        )
        .map_err(|source| RingError::Io {
            op: "sendmsg",
            source,
        })
    }

    /// Receives what [`RingFds::send`] sent: exactly three descriptors and the tag.
    pub fn recv(sock: &std::os::unix::net::UnixStream) -> Result<RingFds, RingError> {
        let (fds, extra) = Self::recv_with(sock)?;
        if !extra.is_empty() {
            return Err(RingError::Handshake(format!(
                "{} unexpected bytes after the tag",
                extra.len()
            )));
        }
        Ok(fds)
    }

    /// Receives what [`RingFds::send_with`] sent: the descriptors and the extra bytes.
    pub fn recv_with(
        sock: &std::os::unix::net::UnixStream,
    ) -> Result<(RingFds, Vec<u8>), RingError> {
        Self::recv_tagged(sock).map(|(fds, extra, _)| (fds, extra))
    }

    /// Receives what [`RingFds::send_tagged`] sent: the descriptors, the extra bytes, and
    /// whether the tag was [`HANDSHAKE_SHARED`].
    pub fn recv_tagged(
        sock: &std::os::unix::net::UnixStream,
    ) -> Result<(RingFds, Vec<u8>, bool), RingError> {
        let mut buf = [0u8; HANDSHAKE.len() + MAX_HANDSHAKE_EXTRA];
        let (n, fds) = recv_fds(sock, &mut buf, 4).map_err(|source| RingError::Io {
            op: "recvmsg",
            source,
        })?;
        let msg = &buf[..n];
        let shared = msg.starts_with(HANDSHAKE_SHARED);
        let Some(extra) = msg
            .strip_prefix(HANDSHAKE)
            .or_else(|| msg.strip_prefix(HANDSHAKE_SHARED))
        else {
            return Err(RingError::Handshake(format!(
                "expected tag {:?}, got {:?}",
                String::from_utf8_lossy(HANDSHAKE),
                String::from_utf8_lossy(&buf[..n.min(HANDSHAKE.len())])
            )));
        };
        let got = fds.len();
        let [memfd, consumer_wake, producer_wake]: [OwnedFd; 3] = fds
            .try_into()
            .map_err(|_| RingError::Handshake(format!("expected 3 descriptors, got {got}")))?;
        Ok((
            RingFds {
                memfd,
                consumer_wake,
                producer_wake,
            },
            extra.to_vec(),
            shared,
        ))
    }
}

impl RingProducer {
    /// Maps a ring created by [`RingConsumer::create`] (usually received with
    /// [`RingFds::recv`]). Trusts nothing: the memfd must be sealed against shrinking, and the
    /// header must describe exactly the file it is in, with one reader.
    pub fn attach(fds: RingFds) -> Result<RingProducer, RingError> {
        let (map, layout, meta) = map_checked(&fds.memfd)?;
        if layout.readers != 1 {
            return Err(LayoutError::NotOneReader(layout.readers).into());
        }
        let head = map.header().producer.0.load(Ordering::Acquire);
        Ok(RingProducer {
            map,
            layout,
            readers: vec![Reader::Active {
                wake: fds.consumer_wake,
            }],
            producer_wake: fds.producer_wake,
            peer: None,
            head,
            reserved: false,
            closed: false,
            checksums: meta.flags & layout::FLAG_CRC != 0,
            floor: None,
            memfd: None,
        })
    }

    /// Creates a ring of `slots` slots of `slot_size` bytes with `readers` reader blocks, none
    /// handed out yet, to share with readers on this host ([`RingProducer::add_reader`]).
    /// With `checksums`, each batch carries its crc32c, computed once for every reader.
    pub fn create(
        readers: u32,
        slots: u32,
        slot_size: u64,
        checksums: bool,
    ) -> Result<RingProducer, RingError> {
        let layout = Layout::with_readers(slots, slot_size, readers)?;
        let (memfd, map) = new_ring_file(&layout, checksums)?;
        let producer_wake = new_eventfd()?;
        // Blocks not yet handed out read as closed: only `add_reader` opens one.
        for r in 0..readers {
            let lines = map.reader(&layout, r);
            lines.closed.0.store(CONSUMER_CLOSED, Ordering::Relaxed);
        }
        Ok(RingProducer {
            map,
            layout,
            readers: (0..readers).map(|_| Reader::Vacant).collect(),
            producer_wake,
            peer: None,
            head: 0,
            reserved: false,
            closed: false,
            checksums,
            floor: None,
            memfd: Some(memfd),
        })
    }

    /// Hands out a reader block whose first batch is `start`: one still in the ring
    /// (`head - slots <= start <= head`, and past `head - slots` while the slot of `head` is
    /// reserved: it is being overwritten), or the next one published. Returns the block and
    /// the descriptors to send the reader ([`Answer::Reader`]).
    pub fn add_reader(&mut self, start: u64) -> Result<(u32, RingFds), RingError> {
        let n = u64::from(self.layout.slot_count);
        let oldest = (self.head + u64::from(self.reserved)).saturating_sub(n);
        if start < oldest || start > self.head || self.closed {
            return Err(RingError::ReaderRefused(format!(
                "batch {start} is not in the ring, which holds {oldest}..{}{}",
                self.head,
                if self.closed { " and is closed" } else { "" }
            )));
        }
        let memfd = self.memfd.as_ref().ok_or_else(|| {
            RingError::ReaderRefused("a session's own ring takes no readers".into())
        })?;
        let Some(r) = self
            .readers
            .iter()
            .position(|r| matches!(r, Reader::Vacant))
        else {
            return Err(RingError::ReaderRefused(format!(
                "all {} reader blocks were handed out",
                self.readers.len()
            )));
        };
        let wake = new_eventfd()?;
        let fds = RingFds {
            memfd: dup(memfd)?,
            consumer_wake: dup(&wake)?,
            producer_wake: dup(&self.producer_wake)?,
        };
        let lines = self.map.reader(&self.layout, r as u32);
        lines.consumer.0.store(start, Ordering::Relaxed);
        lines.consumer_wakeup.0.store(0, Ordering::Relaxed);
        lines.consumer_wake_at.0.store(0, Ordering::Relaxed);
        lines.closed.0.store(0, Ordering::Release);
        self.readers[r] = Reader::Active { wake };
        Ok((r as u32, fds))
    }
}

/// Tags the agent's answer to a shared-stream subscriber's offer ([`HANDSHAKE_SHARED`]).
pub const ANSWER: &[u8] = b"dquant-ring/a";

/// What the agent answers a subscriber that offered its ring with [`HANDSHAKE_SHARED`]: read
/// the ring you offered, or read this reader block of the stream's shared ring.
#[derive(Debug)]
pub enum Answer {
    Own,
    Reader { fds: RingFds, reader: u32 },
}

impl Answer {
    /// Sends the answer on `sock`.
    pub fn send(&self, sock: &std::os::unix::net::UnixStream) -> Result<(), RingError> {
        let sent = match self {
            Answer::Own => send_fds(sock, &[], &[ANSWER, &[0]].concat()),
            Answer::Reader { fds, reader } => send_fds(
                sock,
                &[
                    fds.memfd.as_fd(),
                    fds.consumer_wake.as_fd(),
                    fds.producer_wake.as_fd(),
                ],
                &[ANSWER, &[1], &reader.to_le_bytes()].concat(),
            ),
        };
        sent.map_err(|source| RingError::Io {
            op: "sendmsg",
            source,
        })
    }

    /// Receives an answer on `sock`; `None` when the agent wrote something else first (it
    /// refused the session: its message follows on the socket, for the ring offered).
    /// Reads the answer's bytes and no more: a message the agent writes right after it (a
    /// stream that failed at once) stays on the socket for the reader.
    pub fn recv(sock: &std::os::unix::net::UnixStream) -> Result<Option<Answer>, RingError> {
        let mut head = [0u8; ANSWER.len() + 1];
        let peeked = rustix::net::recv(sock, &mut head, rustix::net::RecvFlags::PEEK)
            .map_err(io_err("recv"))?
            .0;
        if peeked == 0 || head[0] != ANSWER[0] {
            return Ok(None);
        }
        // The answer is one `sendmsg`: when its first byte is here, all of it is.
        let len = match head[ANSWER.len()] {
            1 if peeked == head.len() => head.len() + 4,
            _ => head.len(),
        };
        let mut buf = [0u8; ANSWER.len() + 5];
        let (n, fds) = recv_fds(sock, &mut buf[..len], 4).map_err(|source| RingError::Io {
            op: "recvmsg",
            source,
        })?;
        let bad = |what: String| RingError::Handshake(format!("the agent's answer: {what}"));
        match (buf[..n].strip_prefix(ANSWER), fds.len()) {
            (Some([0]), 0) => Ok(Some(Answer::Own)),
            (Some([1, r @ ..]), 3) if r.len() == 4 => {
                let reader = u32::from_le_bytes([r[0], r[1], r[2], r[3]]);
                let [memfd, consumer_wake, producer_wake]: [OwnedFd; 3] =
                    fds.try_into().map_err(|_| bad("descriptors".into()))?;
                let fds = RingFds {
                    memfd,
                    consumer_wake,
                    producer_wake,
                };
                Ok(Some(Answer::Reader { fds, reader }))
            }
            (_, k) => Err(bad(format!("{n} bytes and {k} descriptors"))),
        }
    }
}
