//! Setting a ring up between two processes. The host creates the memfd, sizes it and seals it
//! so that it can never shrink under the agent's mapping, writes the layout into its header
//! and makes the two eventfds; [`RingFds`] carries the three descriptors over a Unix socket
//! in one message that starts with the [`HANDSHAKE`] tag (and may carry the bytes that
//! authorise the ring); [`RingProducer::attach`] checks the seals and the header against the
//! file before the agent writes anything.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::{MemfdFlags, SealFlags};

use super::fdpass::{recv_fds, send_fds};
use super::layout::{self, Header, Layout, LayoutError};
use super::memory::{ConsumerMem, Map};
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
        // SAFETY: the mapping is fresh, zero-filled, page aligned and nobody else has it yet;
        // `Meta` is plain data at offset 0.
        let flags = if checksums { layout::FLAG_CRC } else { 0 };
        unsafe {
            file.ptr
                .as_ptr()
                .cast::<layout::Meta>()
                .write(layout.meta(flags))
        };
        let consumer_wake = new_eventfd()?;
        let producer_wake = new_eventfd()?;
        let fds = RingFds {
            memfd: dup(&memfd)?,
            consumer_wake: dup(&consumer_wake)?,
            producer_wake: dup(&producer_wake)?,
        };
        let hold_limit = if slot_size.is_multiple_of(layout::PAGE) {
            u64::from((slots / 2).max(1))
        } else {
            u64::from(slots)
        };
        let mem = ConsumerMem {
            file,
            layout,
            memfd,
            slots: Mutex::new((0..slots).map(|_| None).collect()),
            state: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            detached: Mutex::new(HashMap::new()),
        };
        let consumer = RingConsumer {
            mem: Arc::new(mem),
            consumer_wake,
            producer_wake,
            peer: None,
            read: 0,
            tail: 0,
            verify: checksums,
            batch_wakeups: (slots / 2).max(1),
            slow_producer: std::cell::Cell::new(false),
            hold_limit,
            detached: 0,
        };
        Ok((consumer, fds))
    }
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, RingError> {
    fd.try_clone()
        .map_err(|source| RingError::Io { op: "dup", source })
}

/// Every fd handshake starts with this tag (a listener can tell it from other protocols on
/// the same socket by its first bytes).
pub const HANDSHAKE: &[u8] = b"dquant-ring/1";

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
        if extra.len() > MAX_HANDSHAKE_EXTRA {
            return Err(RingError::Handshake(format!(
                "{} extra bytes, at most {MAX_HANDSHAKE_EXTRA}",
                extra.len()
            )));
        }
        let msg = [HANDSHAKE, extra].concat();
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
        let mut buf = [0u8; HANDSHAKE.len() + MAX_HANDSHAKE_EXTRA];
        let (n, fds) = recv_fds(sock, &mut buf, 4).map_err(|source| RingError::Io {
            op: "recvmsg",
            source,
        })?;
        let Some(extra) = buf[..n].strip_prefix(HANDSHAKE) else {
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
        ))
    }
}

impl RingProducer {
    /// Maps a ring created by [`RingConsumer::create`] (usually received with
    /// [`RingFds::recv`]). Trusts nothing: the memfd must be sealed against shrinking, and the
    /// header must describe exactly the file it is in.
    pub fn attach(fds: RingFds) -> Result<RingProducer, RingError> {
        let seals =
            rustix::fs::fcntl_get_seals(&fds.memfd).map_err(io_err("fcntl(F_GET_SEALS)"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(RingError::NotSealed(seals));
        }
        let stat = rustix::fs::fstat(&fds.memfd).map_err(io_err("fstat"))?;
        let file_len = u64::try_from(stat.st_size).unwrap_or(0);
        if file_len < std::mem::size_of::<Header>() as u64 {
            return Err(LayoutError::TooSmall(file_len).into());
        }
        let map = Map::new(&fds.memfd, 0, file_len)?;
        // SAFETY: the mapping holds at least a header (checked above); `Meta` is plain data,
        // copied out once and validated before anything else is read.
        let meta = unsafe { map.ptr.as_ptr().cast::<layout::Meta>().read_volatile() };
        let layout = Layout::validate(&meta, file_len)?;
        let head = map.header().producer.0.load(Ordering::Acquire);
        Ok(RingProducer {
            map,
            layout,
            consumer_wake: fds.consumer_wake,
            producer_wake: fds.producer_wake,
            peer: None,
            head,
            closed: false,
            checksums: meta.flags & layout::FLAG_CRC != 0,
        })
    }
}
