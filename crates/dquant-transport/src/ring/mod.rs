//! Shared-memory ring transport: the emulated DMA path (not yet wired into agent or client).
//!
//! The host ([`RingConsumer`]) creates a sealed memfd holding a ring of slots plus two eventfds
//! and hands all three to the agent ([`RingProducer`]) over a Unix socket ([`RingFds::send`],
//! [`RingFds::recv`]). The producer [reserves](RingProducer::reserve) a free slot, writes a batch
//! and [commits](SlotMut::commit) it; the consumer's [`RingConsumer::next`] returns a
//! [`SlotRef`] view that releases the slot when dropped. See [`layout`] for the byte layout and
//! the memory-ordering argument. A side that keeps up makes no syscall per batch: eventfds are
//! written only when the other side set its need-wakeup flag.

pub mod fdpass;
pub mod layout;
#[cfg(test)]
mod model;

use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

pub use fdpass::{recv_fds, send_fds};
use layout::{
    Header, Layout, LayoutError, Record, CONSUMER_CLOSED, PRODUCER_ABORTED, PRODUCER_CLOSED,
};

/// Everything that can go wrong on the ring.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("ring: {op}: {source}")]
    Io { op: &'static str, source: io::Error },
    #[error("ring: memfd is not sealed against shrinking (seals {0:?}); refusing to map it")]
    NotSealed(SealFlags),
    #[error("ring: no batch within {0:?}")]
    Timeout(Duration),
    #[error("ring: producer went away without closing the ring; all {complete} complete batches were delivered")]
    ProducerGone { complete: u64 },
    #[error("ring: consumer went away")]
    ConsumerGone,
    #[error("ring: batch {seq} is corrupt: {what}")]
    Corrupt { seq: u64, what: String },
    #[error("ring: batch of {len} bytes does not fit a {slot_size}-byte slot")]
    TooLarge { len: usize, slot_size: u64 },
    #[error("ring: fd handshake: {0}")]
    Handshake(String),
}

fn io_err(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> RingError {
    move |e| RingError::Io {
        op,
        source: e.into(),
    }
}

/// The three descriptors that make a ring: the memfd and the two wakeup eventfds.
#[derive(Debug)]
pub struct RingFds {
    pub memfd: OwnedFd,
    /// Written by the producer to wake a sleeping consumer.
    pub consumer_wake: OwnedFd,
    /// Written by the consumer to wake a producer waiting for a free slot.
    pub producer_wake: OwnedFd,
}

/// A read-write shared mapping of the whole memfd.
struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all cross-thread access to it goes through
// atomics (header, records) or through the slot ownership protocol documented in `layout`.
unsafe impl Send for Map {}
// SAFETY: as above; `&Map` hands out only `&Header` (atomics) and raw pointers.
unsafe impl Sync for Map {}

impl Map {
    fn new(fd: &OwnedFd, len: u64) -> Result<Map, RingError> {
        let len = usize::try_from(len).map_err(|_| LayoutError::TooSmall(len))?;
        // SAFETY: a fresh mapping (null hint, no MAP_FIXED) replaces nothing; `len` is the
        // file's size, which the seals keep from shrinking, so no access can fault.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(io_err("mmap"))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(RingError::Io {
            op: "mmap",
            source: io::Error::other("null mapping"),
        })?;
        Ok(Map { ptr, len })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is page aligned and at least `size_of::<Header>()` long (checked
        // by `Layout::new`/`validate` before mapping); `Header` is repr(C) of plain integers and
        // atomics, valid for any bit pattern.
        unsafe { &*self.ptr.as_ptr().cast::<Header>() }
    }

    fn record(&self, layout: &Layout, index: u32) -> &Record {
        debug_assert!(index < layout.slot_count);
        // SAFETY: `record_offset(index)` plus 16 bytes lies inside the validated layout, is
        // 16-byte aligned (448 + 16 i), and `Record` is valid for any bit pattern.
        unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(layout.record_offset(index) as usize)
                .cast::<Record>()
        }
    }

    fn slot_ptr(&self, layout: &Layout, index: u32) -> *mut u8 {
        debug_assert!(index < layout.slot_count);
        // SAFETY: the slot lies inside the validated layout, hence inside the mapping.
        unsafe { self.ptr.as_ptr().add(layout.slot_offset(index) as usize) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; no reference into the mapping
        // outlives `self` (guards borrow the ring that owns the map).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn new_eventfd() -> Result<OwnedFd, RingError> {
    eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(io_err("eventfd"))
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, RingError> {
    fd.try_clone()
        .map_err(|source| RingError::Io { op: "dup", source })
}

fn kick(fd: &OwnedFd) {
    // An eventfd write only fails when the counter would overflow, and then it is non-zero
    // and the peer will wake anyway.
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 8];
    let _ = rustix::io::read(fd, &mut buf);
}

/// How a wait ended.
enum Woke {
    /// Eventfd or a spurious/poll wakeup: re-check the ring.
    Recheck,
    /// The peer's liveness socket hung up.
    PeerHup,
    Timeout,
}

/// Sleeps on `wake` (and `peer` for hang-up) for at most `until`, with the need-wakeup protocol:
/// `flag` is set, a SeqCst fence issued and `ready()` re-checked before sleeping.
fn wait(
    flag: &AtomicU32,
    wake: &OwnedFd,
    peer: Option<&OwnedFd>,
    until: Option<Instant>,
    ready: impl Fn() -> bool,
) -> Result<Woke, RingError> {
    flag.store(1, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    if ready() {
        flag.store(0, Ordering::Relaxed);
        return Ok(Woke::Recheck);
    }
    let timeout = match until {
        None => None,
        Some(t) => {
            let left = t.saturating_duration_since(Instant::now());
            if left.is_zero() {
                flag.store(0, Ordering::Relaxed);
                return Ok(Woke::Timeout);
            }
            Some(Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            })
        }
    };
    let mut fds = vec![PollFd::new(wake, PollFlags::IN)];
    if let Some(p) = peer {
        // Only hang-up/error matter; POLLHUP and POLLERR are always reported.
        fds.push(PollFd::new(p, PollFlags::RDHUP));
    }
    let r = poll(&mut fds, timeout.as_ref());
    flag.store(0, Ordering::Relaxed);
    match r {
        Ok(_) => {}
        Err(rustix::io::Errno::INTR) => return Ok(Woke::Recheck),
        Err(e) => return Err(io_err("poll")(e)),
    }
    if fds[0].revents().contains(PollFlags::IN) {
        drain(wake);
    }
    if fds.get(1).is_some_and(|p| {
        !(p.revents() & (PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR)).is_empty()
    }) {
        return Ok(Woke::PeerHup);
    }
    Ok(Woke::Recheck)
}

/// The host side: owns the ring, reads batches.
pub struct RingConsumer {
    map: Map,
    layout: Layout,
    consumer_wake: OwnedFd,
    producer_wake: OwnedFd,
    peer: Option<OwnedFd>,
    /// Next batch to read (== the shared consumer index; only this side writes it).
    tail: u64,
    /// The batch at `tail` when it has been acquired and not yet released: its slot and length.
    held: Option<(u32, usize)>,
    /// The producer computes, and this side checks, each batch's crc32c ([`layout::FLAG_CRC`]).
    verify: bool,
    /// Most batches to let accumulate before a sleeping consumer is woken (see `layout`).
    batch_wakeups: u32,
    /// Whether the last batched sleep ran out its timeout (the producer is slow: wake on the
    /// next batch instead). A `Cell` because it changes while the header is borrowed.
    slow_producer: std::cell::Cell<bool>,
}

/// Longest a consumer sleeps waiting for several batches when at least one may come sooner:
/// the latency wake-up batching may add.
pub const WAKE_BATCH_TIMEOUT: Duration = Duration::from_millis(1);

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
        let map = Map::new(&memfd, layout.total_len)?;
        // SAFETY: the mapping is fresh, zero-filled, page aligned and nobody else has it yet;
        // `Meta` is plain data at offset 0.
        let flags = if checksums { layout::FLAG_CRC } else { 0 };
        unsafe {
            map.ptr
                .as_ptr()
                .cast::<layout::Meta>()
                .write(layout.meta(flags))
        };
        let consumer_wake = new_eventfd()?;
        let producer_wake = new_eventfd()?;
        let fds = RingFds {
            memfd,
            consumer_wake: dup(&consumer_wake)?,
            producer_wake: dup(&producer_wake)?,
        };
        let consumer = RingConsumer {
            map,
            layout,
            consumer_wake,
            producer_wake,
            peer: None,
            tail: 0,
            held: None,
            verify: checksums,
            batch_wakeups: (slots / 2).max(1),
            slow_producer: std::cell::Cell::new(false),
        };
        Ok((consumer, fds))
    }

    /// Watches `peer` (typically the Unix socket to the producer) for hang-up: a producer
    /// that dies without closing the ring is then reported as [`RingError::ProducerGone`]
    /// instead of a timeout.
    pub fn set_peer(&mut self, peer: OwnedFd) {
        self.peer = Some(peer);
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Batches consumed so far.
    pub fn consumed(&self) -> u64 {
        self.tail
    }

    /// Wake a sleeping consumer only once `k` batches are ready (clamped to `1..=slots`;
    /// default: half the slots). 1 wakes it for every batch. Larger values trade up to
    /// [`WAKE_BATCH_TIMEOUT`] of latency for fewer wake-ups when the consumer outruns the
    /// producer; a consumer that keeps up never sleeps, whatever `k`.
    pub fn set_batch_wakeups(&mut self, k: u32) {
        self.batch_wakeups = k.clamp(1, self.layout.slot_count);
    }

    /// The next batch, in order, as a view that releases its slot when dropped. `Ok(None)`:
    /// the producer closed the ring and every batch has been read. Waits at most `timeout`
    /// ([`RingError::Timeout`]). A producer that went away without closing is reported
    /// ([`RingError::ProducerGone`]) only after every batch it published has been returned.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<SlotRef<'_>>, RingError> {
        if self.acquire(timeout)?.is_none() {
            return Ok(None);
        }
        let data = self.held_ptr();
        // SAFETY: `held_ptr` points at the acquired slot's `len` bytes, which stay ours (the
        // producer does not touch them) until `release`, called by `SlotRef::drop`; the
        // borrow of `self` by the guard keeps the mapping alive and `release` uncallable.
        let data = unsafe { std::slice::from_raw_parts(data.0, data.1) };
        Ok(Some(SlotRef { ring: self, data }))
    }

    /// Takes the next batch without a guard (for owners that keep the batch across calls,
    /// like the host API's reader): it stays readable through [`held`](RingConsumer::held)
    /// until [`release`](RingConsumer::release). Returns its length, or `None` at the end.
    /// A batch still held is released first.
    pub fn acquire(&mut self, timeout: Duration) -> Result<Option<usize>, RingError> {
        self.release();
        let until = Instant::now().checked_add(timeout);
        let hdr = self.map.header();
        let tail = self.tail;
        let n = u64::from(self.layout.slot_count);
        loop {
            let head = hdr.producer.0.load(Ordering::Acquire);
            if head != tail {
                if head.wrapping_sub(tail) > n {
                    return Err(RingError::Corrupt {
                        seq: tail,
                        what: format!("producer index {head} is more than {n} ahead"),
                    });
                }
                break;
            }
            let closed = hdr.closed.0.load(Ordering::Acquire);
            if closed & (PRODUCER_CLOSED | PRODUCER_ABORTED) != 0 {
                // The flag was set after the last publish: re-read the index before ending.
                if hdr.producer.0.load(Ordering::Acquire) != tail {
                    continue;
                }
                if closed & PRODUCER_CLOSED != 0 {
                    return Ok(None);
                }
                return Err(RingError::ProducerGone { complete: tail });
            }
            // Sleep until `k` batches are ready (the first batch, and any after a slow one,
            // wake at once), or for at most WAKE_BATCH_TIMEOUT when k > 1.
            let k = if tail == 0 || self.slow_producer.get() {
                1
            } else {
                self.batch_wakeups
            };
            let wake_at = tail + u64::from(k);
            hdr.consumer_wake_at.0.store(wake_at, Ordering::Relaxed);
            let ready = || {
                hdr.producer.0.load(Ordering::Acquire) >= wake_at
                    || hdr.closed.0.load(Ordering::Acquire) != 0
            };
            let batch_until = (k > 1)
                .then(|| Instant::now().checked_add(WAKE_BATCH_TIMEOUT))
                .flatten();
            let sleep_until = match (until, batch_until) {
                (Some(u), Some(b)) => Some(u.min(b)),
                (u, b) => u.or(b),
            };
            match wait(
                &hdr.consumer_wakeup.0,
                &self.consumer_wake,
                self.peer.as_ref(),
                sleep_until,
                ready,
            )? {
                // Woken, or the batching timeout ran out: then take what is there, and wake
                // on single batches until the producer catches up.
                Woke::Recheck => self
                    .slow_producer
                    .set(batch_until.is_some_and(|b| Instant::now() >= b)),
                Woke::Timeout if until.is_none_or(|u| Instant::now() < u) => {
                    self.slow_producer.set(true)
                }
                Woke::Timeout => return Err(RingError::Timeout(timeout)),
                Woke::PeerHup => {
                    if hdr.producer.0.load(Ordering::Acquire) != tail
                        || hdr.closed.0.load(Ordering::Acquire) != 0
                    {
                        continue;
                    }
                    return Err(RingError::ProducerGone { complete: tail });
                }
            }
        }
        let index = (tail % n) as u32;
        let rec = self.map.record(&self.layout, index);
        let seq = rec.seq.load(Ordering::Relaxed);
        let len = rec.len.load(Ordering::Relaxed);
        let crc = rec.crc.load(Ordering::Relaxed);
        let corrupt = |what: String| RingError::Corrupt { seq: tail, what };
        if seq != tail {
            return Err(corrupt(format!("record carries sequence {seq}")));
        }
        if u64::from(len) > self.layout.slot_size {
            return Err(corrupt(format!(
                "length {len} exceeds the {}-byte slot",
                self.layout.slot_size
            )));
        }
        if self.verify {
            // SAFETY: the slot is inside the mapping and `len <= slot_size`; by the protocol
            // (the Acquire load above saw `head > tail`) the producer finished writing it and
            // will not touch it again until we advance the consumer index in `release`.
            let data = unsafe {
                std::slice::from_raw_parts(self.map.slot_ptr(&self.layout, index), len as usize)
            };
            let actual = crc32c::crc32c(data);
            if actual != crc {
                return Err(corrupt(format!(
                    "crc32c {actual:#010x}, record says {crc:#010x}"
                )));
            }
        }
        self.held = Some((index, len as usize));
        Ok(Some(len as usize))
    }

    /// The acquired batch's bytes (empty when none is held).
    pub fn held(&self) -> &[u8] {
        let (ptr, len) = self.held_ptr();
        // SAFETY: see `held_ptr`; the returned borrow of `self` keeps `release` (which needs
        // `&mut self`) from running while the slice lives.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    fn held_ptr(&self) -> (*const u8, usize) {
        match self.held {
            // The slot is inside the validated mapping and was acquired (see `acquire`).
            Some((index, len)) => (self.map.slot_ptr(&self.layout, index).cast_const(), len),
            None => (std::ptr::NonNull::<u8>::dangling().as_ptr().cast_const(), 0),
        }
    }

    /// Hands the acquired batch's slot back to the producer (no-op when none is held).
    pub fn release(&mut self) {
        if self.held.take().is_none() {
            return;
        }
        self.tail += 1;
        let hdr = self.map.header();
        hdr.consumer.0.store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if hdr.producer_wakeup.0.load(Ordering::Relaxed) != 0 {
            kick(&self.producer_wake);
        }
    }
}

impl Drop for RingConsumer {
    fn drop(&mut self) {
        self.map
            .header()
            .closed
            .0
            .fetch_or(CONSUMER_CLOSED, Ordering::Release);
        kick(&self.producer_wake);
    }
}

/// A published batch, borrowed from the ring; dropping it hands the slot back to the producer.
pub struct SlotRef<'a> {
    ring: &'a mut RingConsumer,
    data: &'a [u8],
}

impl SlotRef<'_> {
    /// Sequence number of this batch (0-based).
    pub fn seq(&self) -> u64 {
        self.ring.tail
    }
}

impl Deref for SlotRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data
    }
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        self.ring.release();
    }
}

/// The agent side: writes batches into free slots.
pub struct RingProducer {
    map: Map,
    layout: Layout,
    consumer_wake: OwnedFd,
    producer_wake: OwnedFd,
    peer: Option<OwnedFd>,
    /// Next batch to publish (== the shared producer index; only this side writes it).
    head: u64,
    closed: bool,
    /// Compute each batch's crc32c ([`layout::FLAG_CRC`]).
    checksums: bool,
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
        let map = Map::new(&fds.memfd, file_len)?;
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

    /// Watches `peer` (the Unix socket to the consumer) for hang-up while waiting for a slot.
    pub fn set_peer(&mut self, peer: OwnedFd) {
        self.peer = Some(peer);
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Waits (without limit) for a free slot.
    pub fn reserve(&mut self) -> Result<SlotMut<'_>, RingError> {
        self.reserve_until(None)
    }

    /// Waits at most `timeout` for a free slot.
    pub fn reserve_timeout(&mut self, timeout: Duration) -> Result<SlotMut<'_>, RingError> {
        match Instant::now().checked_add(timeout) {
            Some(t) => self.reserve_until(Some(t)).map_err(|e| match e {
                RingError::Timeout(_) => RingError::Timeout(timeout),
                e => e,
            }),
            None => self.reserve_until(None),
        }
    }

    fn reserve_until(&mut self, until: Option<Instant>) -> Result<SlotMut<'_>, RingError> {
        let hdr = self.map.header();
        let n = u64::from(self.layout.slot_count);
        let head = self.head;
        loop {
            if hdr.closed.0.load(Ordering::Acquire) & CONSUMER_CLOSED != 0 {
                return Err(RingError::ConsumerGone);
            }
            let tail = hdr.consumer.0.load(Ordering::Acquire);
            if head.wrapping_sub(tail) < n {
                break;
            }
            let ready = || {
                head.wrapping_sub(hdr.consumer.0.load(Ordering::Acquire)) < n
                    || hdr.closed.0.load(Ordering::Acquire) & CONSUMER_CLOSED != 0
            };
            match wait(
                &hdr.producer_wakeup.0,
                &self.producer_wake,
                self.peer.as_ref(),
                until,
                ready,
            )? {
                Woke::Recheck => {}
                Woke::Timeout => return Err(RingError::Timeout(Duration::ZERO)),
                Woke::PeerHup => return Err(RingError::ConsumerGone),
            }
        }
        let index = (head % n) as u32;
        let len = self.layout.slot_size as usize;
        // SAFETY: the slot is inside the mapping; the Acquire load above saw
        // `head - tail < n`, so the consumer released this slot and will not read it until we
        // publish it; `&mut self` is borrowed by the guard, so there is one writer.
        let data =
            unsafe { std::slice::from_raw_parts_mut(self.map.slot_ptr(&self.layout, index), len) };
        Ok(SlotMut { ring: self, data })
    }

    fn publish(&mut self, len: usize) {
        let hdr = self.map.header();
        let index = (self.head % u64::from(self.layout.slot_count)) as u32;
        let rec = self.map.record(&self.layout, index);
        // SAFETY: as in `reserve_until`: the slot is ours until the Release store below.
        let data =
            unsafe { std::slice::from_raw_parts(self.map.slot_ptr(&self.layout, index), len) };
        rec.seq.store(self.head, Ordering::Relaxed);
        rec.len.store(len as u32, Ordering::Relaxed);
        let crc = if self.checksums {
            crc32c::crc32c(data)
        } else {
            0
        };
        rec.crc.store(crc, Ordering::Relaxed);
        self.head += 1;
        hdr.producer.0.store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        if hdr.consumer_wakeup.0.load(Ordering::Relaxed) != 0
            && self.head >= hdr.consumer_wake_at.0.load(Ordering::Relaxed)
        {
            kick(&self.consumer_wake);
        }
    }

    /// Batches published so far.
    pub fn published(&self) -> u64 {
        self.head
    }

    /// Orderly end of stream: the consumer returns `Ok(None)` after the last batch.
    pub fn close(mut self) {
        self.mark_closed(PRODUCER_CLOSED);
    }

    fn mark_closed(&mut self, bit: u32) {
        if !self.closed {
            self.closed = true;
            self.map.header().closed.0.fetch_or(bit, Ordering::Release);
            kick(&self.consumer_wake);
        }
    }
}

impl Drop for RingProducer {
    /// Dropped without [`close`](RingProducer::close): the consumer reports
    /// [`RingError::ProducerGone`] after the last complete batch. (A producer process that
    /// dies cannot do this; the consumer then sees the peer socket hang up.)
    fn drop(&mut self) {
        self.mark_closed(PRODUCER_ABORTED);
    }
}

/// A reserved slot (all `slot_size` bytes writable). Nothing is visible to the consumer until
/// [`commit`](SlotMut::commit); dropping the guard un-reserves the slot.
pub struct SlotMut<'a> {
    ring: &'a mut RingProducer,
    data: &'a mut [u8],
}

impl SlotMut<'_> {
    /// Publishes the first `len` bytes as the next batch.
    pub fn commit(self, len: usize) -> Result<(), RingError> {
        if len > self.data.len() {
            return Err(RingError::TooLarge {
                len,
                slot_size: self.ring.layout.slot_size,
            });
        }
        self.ring.publish(len);
        Ok(())
    }
}

impl Deref for SlotMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data
    }
}

impl DerefMut for SlotMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.data
    }
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
