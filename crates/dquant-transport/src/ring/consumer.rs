//! The host's side of the ring. [`RingConsumer`] takes batches in order, checks each one's
//! completion record, and hands it out as a view into the slot itself, without a copy.
//! Views ([`RingView`]) may be kept past later batches and dropped in any order (Python arrays
//! over the ring need this); the consumer moves the shared index past every batch whose view
//! is gone, wakes a producer waiting for room, and detaches the oldest views when too many
//! pin their slots. [`SlotRef`] is the borrowed view, released when dropped.

use std::ops::Deref;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::layout::{self, Layout, CONSUMER_CLOSED, PRODUCER_ABORTED, PRODUCER_CLOSED};
use super::memory::{view_state, ConsumerMem, VIEW_DETACHED, VIEW_HELD, VIEW_RELEASED};
use super::wake::{kick, wait, Woke};
use super::{lock, RingError};

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
    pub(super) mem: Arc<ConsumerMem>,
    pub(super) consumer_wake: OwnedFd,
    pub(super) producer_wake: OwnedFd,
    pub(super) peer: Option<OwnedFd>,
    /// Next batch to take.
    pub(super) read: u64,
    /// Batches released (== the shared consumer index; only this side writes it): every
    /// batch before it has been released or detached.
    pub(super) tail: u64,
    /// The producer computes, and this side checks, each batch's crc32c ([`layout::FLAG_CRC`]).
    pub(super) verify: bool,
    /// Most batches to let accumulate before a sleeping consumer is woken (see `layout`).
    pub(super) batch_wakeups: u32,
    /// Whether the last batched sleep ran out its timeout (the producer is slow: wake on the
    /// next batch instead). A `Cell` because it changes while the header is borrowed.
    pub(super) slow_producer: std::cell::Cell<bool>,
    /// Most slots live views may pin before the oldest is detached.
    pub(super) hold_limit: u64,
    /// Batches detached so far.
    pub(super) detached: u64,
    /// A reader of a ring the agent shares: the producer reuses its slots once it is gone, so
    /// the views it leaves behind are copied out first ([`RingConsumer::detach_all`]).
    pub(super) shared: bool,
}

/// The bits of the shared flags by which a producer ends the stream.
const PRODUCER_ENDED: u32 = PRODUCER_CLOSED | PRODUCER_ABORTED;

/// Longest a consumer sleeps waiting for several batches when at least one may come sooner:
/// the latency wake-up batching may add.
pub const WAKE_BATCH_TIMEOUT: Duration = Duration::from_millis(1);

impl RingConsumer {
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

    /// Whether this is a reader of a ring the agent shares ([`RingConsumer::attach`]).
    pub fn is_shared(&self) -> bool {
        self.shared
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
        if !self.wait_published(timeout)? {
            return Ok(None);
        }
        let read = self.read;
        let (ptr, len) = self.checked_record(read)?;
        let mem = Arc::clone(&self.mem);
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

    /// Waits until the producer has published the batch at `self.read` (`Ok(true)`) or ended
    /// the stream before it (`Ok(false)`), sleeping on the wake-up word between looks.
    fn wait_published(&self, timeout: Duration) -> Result<bool, RingError> {
        let until = Instant::now().checked_add(timeout);
        let hdr = self.mem.file.header();
        let lines = self.mem.lines();
        let read = self.read;
        let n = u64::from(self.mem.layout.slot_count);
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
                return Ok(true);
            }
            let closed = lines.closed.0.load(Ordering::Acquire);
            if closed & PRODUCER_ENDED != 0 {
                // The flag was set after the last publish: re-read the index before ending.
                if hdr.producer.0.load(Ordering::Acquire) != read {
                    continue;
                }
                if closed & PRODUCER_CLOSED != 0 {
                    return Ok(false);
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
            lines.consumer_wake_at.0.store(wake_at, Ordering::Relaxed);
            // Only the producer's own bits end a wait: any other bit a hostile producer sets
            // in the shared flags would make every wait return at once, and the loop spin
            // past its timeout (found by the `ring_consumer` fuzz target).
            let producer_ended = || lines.closed.0.load(Ordering::Acquire) & PRODUCER_ENDED != 0;
            let ready = || hdr.producer.0.load(Ordering::Acquire) >= wake_at || producer_ended();
            let batch_until = (wake_at > read + 1)
                .then(|| Instant::now().checked_add(WAKE_BATCH_TIMEOUT))
                .flatten();
            let sleep_until = match (until, batch_until) {
                (Some(u), Some(b)) => Some(u.min(b)),
                (u, b) => u.or(b),
            };
            match wait(
                &lines.consumer_wakeup.0,
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
                    if hdr.producer.0.load(Ordering::Acquire) != read || producer_ended() {
                        continue;
                    }
                    return Err(RingError::ProducerGone { complete: read });
                }
            }
        }
    }

    /// The record at `read`, checked (its sequence, its length against the slot, its crc32c
    /// when asked): where its bytes start, and how many. Only after [`Self::wait_published`]
    /// said it is published.
    fn checked_record(&self, read: u64) -> Result<(*mut u8, u32), RingError> {
        let mem = &self.mem;
        let n = u64::from(mem.layout.slot_count);
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
            // protocol (`wait_published`'s Acquire load saw `head > read`) the producer finished writing
            // it and will not touch it again until the consumer index passes it.
            let data = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
            let actual = crate::frame::payload_crc(data);
            if actual != crc {
                return Err(corrupt(format!(
                    "crc32c {actual:#010x}, record says {crc:#010x}"
                )));
            }
        }
        Ok((ptr, len))
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
        self.mem.lines().consumer.0.store(tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if self
            .mem
            .file
            .header()
            .producer_wakeup
            .0
            .load(Ordering::Relaxed)
            != 0
        {
            kick(&self.producer_wake);
        }
    }

    /// Copies every batch whose view is still alive out of the ring (see the type's docs),
    /// so that no view reads a slot the producer may write once this reader is gone. The
    /// views read the same bytes at the same addresses. Slots that are not page aligned
    /// cannot be detached: their views are left as they are.
    pub fn detach_all(&mut self) -> Result<(), RingError> {
        self.reclaim();
        if !self.can_detach() {
            return Ok(());
        }
        for seq in self.tail..self.read {
            if self.mem.state(seq).load(Ordering::Acquire) == view_state(seq, VIEW_HELD) {
                self.detach(seq)?;
            }
        }
        self.reclaim();
        Ok(())
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
}

impl Drop for RingConsumer {
    fn drop(&mut self) {
        if self.shared {
            // A failure leaves views over slots the producer may reuse: they read what it
            // writes there, never outside their memory.
            let _ = self.detach_all();
        }
        self.mem
            .lines()
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
