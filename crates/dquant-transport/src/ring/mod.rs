//! Shared-memory ring transport: the emulated DMA path into host memory.
//!
//! The host ([`RingConsumer`]) creates a sealed memfd holding a ring of slots plus two eventfds
//! and hands all three to the agent ([`RingProducer`]) over a Unix socket ([`RingFds::send`],
//! [`RingFds::recv`]). The producer [reserves](RingProducer::reserve) a free slot, writes a batch
//! and [commits](SlotMut::commit) it; the consumer's [`RingConsumer::next`] returns a
//! [`SlotRef`] view that releases the slot when dropped, and [`RingConsumer::take`] a
//! [`RingView`] that may outlive later batches and be dropped in any order. See [`layout`] for the byte layout and
//! the memory-ordering argument. A side that keeps up makes no syscall per batch: eventfds are
//! written only when the other side set its need-wakeup flag.

pub mod fdpass;
pub mod layout;
#[cfg(test)]
mod model;

use std::collections::HashMap;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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
    #[error("ring: live views hold all {held} slots and this ring's slots are not page aligned, so none can be detached; drop a batch view first")]
    AllHeld { held: u64 },
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
    /// Maps `len` bytes of `fd` from `offset` (page aligned).
    fn new(fd: &OwnedFd, offset: u64, len: u64) -> Result<Map, RingError> {
        let len = usize::try_from(len).map_err(|_| LayoutError::TooSmall(len))?;
        // SAFETY: a fresh mapping (null hint, no MAP_FIXED) replaces nothing; `offset + len`
        // is within the file's size, which the seals keep from shrinking, so no access can
        // fault.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                offset,
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

/// A batch's status on the consumer side, kept per slot as `seq << 2 | status`, so that the
/// view of an old batch can never be taken for a newer batch in the same slot.
const VIEW_HELD: u64 = 1;
const VIEW_RELEASED: u64 = 2;
const VIEW_DETACHED: u64 = 3;

fn view_state(seq: u64, status: u64) -> u64 {
    seq << 2 | status
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing under these locks can panic half-way through an update.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Memory a detached view owns: a private copy of its batch at the address the view has
/// always read (see [`RingConsumer`] on detaching).
struct Region {
    ptr: NonNull<u8>,
    len: usize,
    /// The address lies inside the consumer's mapping of the whole file. Freeing it then
    /// maps inaccessible pages over it instead of unmapping: a hole could be reused by an
    /// unrelated mapping, which unmapping the whole file would later destroy.
    in_file_map: bool,
}

// SAFETY: a region is plain private memory; whoever holds it (the map of detached copies,
// behind a mutex) is the only one to free it.
unsafe impl Send for Region {}

impl Region {
    fn free(self) {
        // SAFETY: the region is exactly one private mapping this consumer created, and its
        // only reader (the view) is gone. Failure leaves the pages mapped: a leak, not a fault.
        unsafe {
            if self.in_file_map {
                let _ = rustix::mm::mmap_anonymous(
                    self.ptr.as_ptr().cast(),
                    self.len,
                    ProtFlags::empty(),
                    MapFlags::PRIVATE | MapFlags::FIXED | MapFlags::NORESERVE,
                );
            } else {
                let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
            }
        }
    }
}

/// The consumer's mappings, shared with every [`RingView`] so that a view keeps its memory
/// after the consumer is gone.
struct ConsumerMem {
    /// The whole file, mapped once: header, records and, at first, every slot.
    file: Map,
    layout: Layout,
    /// A duplicate of the memfd, to map a slot afresh after a detach.
    memfd: OwnedFd,
    /// Where the ring reads each slot now: `None` in `file`, else a mapping of its own.
    slots: Mutex<Vec<Option<Map>>>,
    /// Per slot, the status of the batch last taken from it ([`view_state`]).
    state: Box<[AtomicU64]>,
    /// The copies that detached views read, by sequence number.
    detached: Mutex<HashMap<u64, Region>>,
}

impl ConsumerMem {
    fn slot_ptr(&self, index: u32) -> *mut u8 {
        self.slot_in(&lock(&self.slots), index)
    }

    /// Where the ring reads slot `index`, given the (locked) per-slot mappings.
    fn slot_in(&self, slots: &[Option<Map>], index: u32) -> *mut u8 {
        match &slots[index as usize] {
            Some(m) => m.ptr.as_ptr(),
            None => self.file.slot_ptr(&self.layout, index),
        }
    }

    fn state(&self, seq: u64) -> &AtomicU64 {
        &self.state[(seq % u64::from(self.layout.slot_count)) as usize]
    }
}

impl Drop for ConsumerMem {
    fn drop(&mut self) {
        // Every view holds this memory, so none is left; this frees what a race left behind.
        for (_, r) in lock(&self.detached).drain() {
            if !r.in_file_map {
                r.free();
            }
        }
    }
}

/// The host side: owns the ring, reads batches.
///
/// # Views that outlive the next batch
///
/// [`take`](RingConsumer::take) hands out [`RingView`]s that may be kept, sent to other
/// threads and dropped in any order (Python arrays over the ring need this: the language
/// decides when they die). The shared consumer index still moves in order: past every batch
/// whose view is gone. A view kept for long would therefore pin its slot and, once the
/// producer wraps around to it, stop the ring. So the consumer lets views pin at most
/// [`hold_limit`](RingConsumer::set_hold_limit) slots (default: half the ring). Past that, the
/// oldest pinned batch is *detached*: copied into private memory which is then moved over the
/// view's address with `mremap` (the view reads the same bytes at the same address, before
/// and after), and the slot is mapped afresh for the ring. A consumer whose views die within
/// a few batches never copies; one that keeps every batch copies each batch once, when the
/// ring needs its slot. Detaching needs page-aligned slots (slot size a multiple of
/// [`PAGE`](layout::PAGE)); without, views may pin every slot and then `take` fails.
pub struct RingConsumer {
    mem: Arc<ConsumerMem>,
    consumer_wake: OwnedFd,
    producer_wake: OwnedFd,
    peer: Option<OwnedFd>,
    /// Next batch to take.
    read: u64,
    /// Batches released (== the shared consumer index; only this side writes it): every
    /// batch before it has been released or detached.
    tail: u64,
    /// The producer computes, and this side checks, each batch's crc32c ([`layout::FLAG_CRC`]).
    verify: bool,
    /// Most batches to let accumulate before a sleeping consumer is woken (see `layout`).
    batch_wakeups: u32,
    /// Whether the last batched sleep ran out its timeout (the producer is slow: wake on the
    /// next batch instead). A `Cell` because it changes while the header is borrowed.
    slow_producer: std::cell::Cell<bool>,
    /// Most slots live views may pin before the oldest is detached.
    hold_limit: u64,
    /// Batches detached so far.
    detached: u64,
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

    /// Watches `peer` (typically the Unix socket to the producer) for hang-up: a producer
    /// that dies without closing the ring is then reported as [`RingError::ProducerGone`]
    /// instead of a timeout.
    pub fn set_peer(&mut self, peer: OwnedFd) {
        self.peer = Some(peer);
    }

    pub fn layout(&self) -> &Layout {
        &self.mem.layout
    }

    /// Batches consumed so far: taken, and released or detached.
    pub fn consumed(&self) -> u64 {
        self.tail
    }

    /// Batches detached so far (copied out of the ring because their views lived long).
    pub fn detached(&self) -> u64 {
        self.detached
    }

    /// Wake a sleeping consumer only once `k` batches are ready (clamped to `1..=slots`;
    /// default: half the slots). 1 wakes it for every batch. Larger values trade up to
    /// [`WAKE_BATCH_TIMEOUT`] of latency for fewer wake-ups when the consumer outruns the
    /// producer; a consumer that keeps up never sleeps, whatever `k`.
    pub fn set_batch_wakeups(&mut self, k: u32) {
        self.batch_wakeups = k.clamp(1, self.layout().slot_count);
    }

    /// Let live views pin at most `k` slots (clamped to `1..slots`, and to `slots` when slots
    /// are not page aligned) before the oldest is detached. Default: half the slots. Fewer
    /// leaves the producer more room to run ahead; more copies less for consumers that keep
    /// batches for a while.
    pub fn set_hold_limit(&mut self, k: u32) {
        let n = self.layout().slot_count;
        self.hold_limit = if self.can_detach() {
            u64::from(k.clamp(1, (n - 1).max(1)))
        } else {
            u64::from(n)
        };
    }

    fn can_detach(&self) -> bool {
        self.layout().slot_size.is_multiple_of(layout::PAGE)
    }

    /// The next batch, in order, as a view that releases its slot when dropped. `Ok(None)`:
    /// the producer closed the ring and every batch has been read. Waits at most `timeout`
    /// ([`RingError::Timeout`]). A producer that went away without closing is reported
    /// ([`RingError::ProducerGone`]) only after every batch it published has been returned.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<SlotRef<'_>>, RingError> {
        Ok(self.take(timeout)?.map(|view| SlotRef {
            ring: self,
            view: Some(view),
        }))
    }

    /// The next batch as a view that may outlive this call, this consumer, and later views
    /// (see the type's docs); `Ok(None)` at the end. Errors as [`next`](RingConsumer::next);
    /// also [`RingError::AllHeld`] when views pin every slot of a ring that cannot detach.
    pub fn take(&mut self, timeout: Duration) -> Result<Option<RingView>, RingError> {
        self.make_room()?;
        let until = Instant::now().checked_add(timeout);
        let mem = Arc::clone(&self.mem);
        let hdr = mem.file.header();
        let read = self.read;
        let n = u64::from(mem.layout.slot_count);
        loop {
            let head = hdr.producer.0.load(Ordering::Acquire);
            if head != read {
                if head.wrapping_sub(self.tail) > n || head < read {
                    return Err(RingError::Corrupt {
                        seq: read,
                        what: format!(
                            "producer index {head} is not within {read}..={}",
                            self.tail + n
                        ),
                    });
                }
                break;
            }
            let closed = hdr.closed.0.load(Ordering::Acquire);
            if closed & (PRODUCER_CLOSED | PRODUCER_ABORTED) != 0 {
                // The flag was set after the last publish: re-read the index before ending.
                if hdr.producer.0.load(Ordering::Acquire) != read {
                    continue;
                }
                if closed & PRODUCER_CLOSED != 0 {
                    return Ok(None);
                }
                return Err(RingError::ProducerGone { complete: read });
            }
            // Sleep until `k` batches are ready (the first batch, and any after a slow one,
            // wake at once), or for at most WAKE_BATCH_TIMEOUT when k > 1. Never past a full
            // ring: the producer cannot get further while views pin slots.
            let k = if read == 0 || self.slow_producer.get() {
                1
            } else {
                self.batch_wakeups
            };
            let wake_at = (read + u64::from(k)).min(self.tail + n);
            hdr.consumer_wake_at.0.store(wake_at, Ordering::Relaxed);
            let ready = || {
                hdr.producer.0.load(Ordering::Acquire) >= wake_at
                    || hdr.closed.0.load(Ordering::Acquire) != 0
            };
            let batch_until = (wake_at > read + 1)
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
                    if hdr.producer.0.load(Ordering::Acquire) != read
                        || hdr.closed.0.load(Ordering::Acquire) != 0
                    {
                        continue;
                    }
                    return Err(RingError::ProducerGone { complete: read });
                }
            }
        }
        let index = (read % n) as u32;
        let rec = mem.file.record(&mem.layout, index);
        let seq = rec.seq.load(Ordering::Relaxed);
        let len = rec.len.load(Ordering::Relaxed);
        let crc = rec.crc.load(Ordering::Relaxed);
        let corrupt = |what: String| RingError::Corrupt { seq: read, what };
        if seq != read {
            return Err(corrupt(format!("record carries sequence {seq}")));
        }
        if u64::from(len) > mem.layout.slot_size {
            return Err(corrupt(format!(
                "length {len} exceeds the {}-byte slot",
                mem.layout.slot_size
            )));
        }
        let ptr = mem.slot_ptr(index);
        if self.verify {
            // SAFETY: the slot is inside a mapping of the file and `len <= slot_size`; by the
            // protocol (the Acquire load above saw `head > read`) the producer finished writing
            // it and will not touch it again until the consumer index passes it.
            let data = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
            let actual = crc32c::crc32c(data);
            if actual != crc {
                return Err(corrupt(format!(
                    "crc32c {actual:#010x}, record says {crc:#010x}"
                )));
            }
        }
        mem.state(read)
            .store(view_state(read, VIEW_HELD), Ordering::Release);
        self.read += 1;
        Ok(Some(RingView {
            ptr: NonNull::new(ptr).expect("slot pointers come from non-null mappings"),
            len: len as usize,
            seq: read,
            mem,
        }))
    }

    /// Moves the shared consumer index past every batch whose view is gone, and wakes the
    /// producer if it waits for a slot.
    fn reclaim(&mut self) {
        let mut tail = self.tail;
        while tail < self.read {
            let v = self.mem.state(tail).load(Ordering::Acquire);
            if v != view_state(tail, VIEW_RELEASED) && v != view_state(tail, VIEW_DETACHED) {
                break;
            }
            tail += 1;
        }
        if tail == self.tail {
            return;
        }
        self.tail = tail;
        let hdr = self.mem.file.header();
        hdr.consumer.0.store(tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if hdr.producer_wakeup.0.load(Ordering::Relaxed) != 0 {
            kick(&self.producer_wake);
        }
    }

    /// Reclaims released slots, then detaches the oldest pinned batches until live views pin
    /// fewer than the hold limit. Runs at the start of every `take`; callers that must not
    /// copy concurrently with other threads (an interpreter lock) may call it first.
    pub fn make_room(&mut self) -> Result<(), RingError> {
        self.reclaim();
        while self.read - self.tail >= self.hold_limit {
            if !self.can_detach() {
                return Err(RingError::AllHeld {
                    held: self.read - self.tail,
                });
            }
            self.detach(self.tail)?;
            self.reclaim();
        }
        Ok(())
    }

    /// Gives the live view of batch `seq` a private copy at its own address and maps the
    /// slot afresh for the ring; the batch then counts as released.
    fn detach(&mut self, seq: u64) -> Result<(), RingError> {
        let mem = &*self.mem;
        let index = (seq % u64::from(mem.layout.slot_count)) as u32;
        let size = mem.layout.slot_size as usize;
        let len = mem
            .file
            .record(&mem.layout, index)
            .len
            .load(Ordering::Relaxed) as usize;
        let mut slots = lock(&mem.slots);
        let old = mem.slot_in(&slots, index);
        let fresh = Map::new(&mem.memfd, mem.layout.slot_offset(index), size as u64)?;
        // SAFETY: a fresh private mapping of `size` bytes, replacing nothing.
        let copy = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .map_err(io_err("mmap"))?;
        // SAFETY: `old` holds the batch's `len <= size` bytes (checked when it was taken), the
        // producer does not write it while the view pins it, and `copy` is `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(old, copy.cast::<u8>(), len) };
        // SAFETY: moves the copy over exactly the old slot's pages, which are page aligned
        // (`can_detach`) and belong to a mapping this consumer owns. The view reads the same
        // bytes before and after; the ring reads the slot through `fresh` from now on.
        let moved = unsafe {
            rustix::mm::mremap_fixed(
                copy,
                size,
                size,
                rustix::mm::MremapFlags::MAYMOVE,
                old.cast(),
            )
        };
        if let Err(e) = moved {
            // SAFETY: `copy` is still our own mapping of `size` bytes.
            let _ = unsafe { rustix::mm::munmap(copy, size) };
            return Err(io_err("mremap")(e));
        }
        let region = Region {
            ptr: NonNull::new(old).expect("slot pointers are non-null"),
            len: size,
            in_file_map: slots[index as usize].is_none(),
        };
        if let Some(m) = slots[index as usize].replace(fresh) {
            // The region owns these pages now.
            std::mem::forget(m);
        }
        drop(slots);
        lock(&mem.detached).insert(seq, region);
        let state = mem.state(seq);
        if state
            .compare_exchange(
                view_state(seq, VIEW_HELD),
                view_state(seq, VIEW_DETACHED),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // The view was dropped while we copied: nobody reads the copy.
            if let Some(r) = lock(&mem.detached).remove(&seq) {
                r.free();
            }
        }
        self.detached += 1;
        Ok(())
    }
}

impl Drop for RingConsumer {
    fn drop(&mut self) {
        self.mem
            .file
            .header()
            .closed
            .0
            .fetch_or(CONSUMER_CLOSED, Ordering::Release);
        kick(&self.producer_wake);
    }
}

/// A batch taken with [`RingConsumer::take`]: its bytes, readable for as long as the view
/// lives, from any thread. Dropping it hands the slot back (or frees its private copy, once
/// detached).
pub struct RingView {
    mem: Arc<ConsumerMem>,
    seq: u64,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the view only reads memory that stays valid and unwritten while it lives: its slot
// (which the producer does not write while the view pins it) or its private copy; `mem` is
// shared through atomics and mutexes.
unsafe impl Send for RingView {}
// SAFETY: as above; `&RingView` only reads.
unsafe impl Sync for RingView {}

impl RingView {
    /// Sequence number of this batch (0-based).
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Deref for RingView {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: see the `Send` impl; `ptr` is valid for `len` bytes while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for RingView {
    fn drop(&mut self) {
        let state = self.mem.state(self.seq);
        if state
            .compare_exchange(
                view_state(self.seq, VIEW_HELD),
                view_state(self.seq, VIEW_RELEASED),
                Ordering::Release,
                Ordering::Acquire,
            )
            .is_err()
        {
            // Detached: free the private copy.
            if let Some(r) = lock(&self.mem.detached).remove(&self.seq) {
                r.free();
            }
        }
    }
}

/// A published batch, borrowed from the ring; dropping it hands the slot back to the producer.
pub struct SlotRef<'a> {
    ring: &'a mut RingConsumer,
    view: Option<RingView>,
}

impl SlotRef<'_> {
    /// Sequence number of this batch (0-based).
    pub fn seq(&self) -> u64 {
        self.view.as_ref().map_or(0, RingView::seq)
    }
}

impl Deref for SlotRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.view.as_deref().unwrap_or(&[])
    }
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        self.view = None;
        self.ring.reclaim();
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

impl<'a> SlotMut<'a> {
    /// The slot's bytes without the guard, the slot staying reserved and unpublished: a
    /// caller that fills it now and publishes later reserves again (which returns this same
    /// slot at once) and commits that guard.
    pub fn into_mut(self) -> &'a mut [u8] {
        self.data
    }

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
