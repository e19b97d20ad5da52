//! The agent's side of the ring. [`RingProducer`] reserves the next free slot, lets the caller
//! write a batch into it in place ([`SlotMut`]) and publishes it with a Release store of the
//! producer index, waking the consumer only if it sleeps. Closing marks the end of the
//! stream; dropping the producer without closing marks it aborted, so the consumer can tell a
//! finished stream from a broken one.

use std::ops::{Deref, DerefMut};
use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use super::layout::{Layout, CONSUMER_CLOSED, PRODUCER_ABORTED, PRODUCER_CLOSED};
use super::memory::Map;
use super::wake::{kick, wait, Woke};
use super::RingError;

/// The agent side: writes batches into free slots.
pub struct RingProducer {
    pub(super) map: Map,
    pub(super) layout: Layout,
    pub(super) consumer_wake: OwnedFd,
    pub(super) producer_wake: OwnedFd,
    pub(super) peer: Option<OwnedFd>,
    /// Next batch to publish (== the shared producer index; only this side writes it).
    pub(super) head: u64,
    pub(super) closed: bool,
    /// Compute each batch's crc32c ([`layout::FLAG_CRC`](super::layout::FLAG_CRC)).
    pub(super) checksums: bool,
}

impl RingProducer {
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
        // The indices are free-running counters, and the consumer wrote the index this one
        // started from: `u64::MAX` must wrap, not panic (found by the `ring_header` fuzz
        // target).
        self.head = self.head.wrapping_add(1);
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
