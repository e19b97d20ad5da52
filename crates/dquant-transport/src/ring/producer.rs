//! The agent's side of the ring. [`RingProducer`] reserves the next free slot, lets the caller
//! write a batch into it in place ([`SlotMut`]) and publishes it with a Release store of the
//! producer index, waking each reader only if it sleeps. Closing marks the end of the
//! stream; dropping the producer without closing marks it aborted, so a reader can tell a
//! finished stream from a broken one.
//!
//! A slot is free once every active reader has released it (and, for a ring the agent shares,
//! once no subscriber that may still attach needs it: [`RingProducer::set_floor`]). Which
//! readers are active is the producer's own record, never read back from shared memory: a
//! reader only ever tells the producer how far it got and that it left.

use std::ops::{Deref, DerefMut};
use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use super::layout::{Layout, ReaderLines, CONSUMER_CLOSED, PRODUCER_ABORTED, PRODUCER_CLOSED};
use super::memory::Map;
use super::wake::{kick, wait, Woke};
use super::RingError;

/// What the producer knows of one reader block.
pub(super) enum Reader {
    /// Never handed out.
    Vacant,
    /// Reading, woken through `wake` (until it sets `CONSUMER_CLOSED`).
    Active { wake: OwnedFd },
    /// Gone, by the producer's word ([`RingProducer::end_reader`]).
    Ended,
}

/// How much room the readers leave.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    Free,
    Full,
    /// No reader is left to write for.
    Gone,
}

/// The agent side: writes batches into free slots.
pub struct RingProducer {
    pub(super) map: Map,
    pub(super) layout: Layout,
    /// One per reader block.
    pub(super) readers: Vec<Reader>,
    pub(super) producer_wake: OwnedFd,
    pub(super) peer: Option<OwnedFd>,
    /// Next batch to publish (== the shared producer index; only this side writes it).
    pub(super) head: u64,
    /// The slot of `head` was handed out and may be being written.
    pub(super) reserved: bool,
    pub(super) closed: bool,
    /// Compute each batch's crc32c ([`layout::FLAG_CRC`](super::layout::FLAG_CRC)).
    pub(super) checksums: bool,
    /// The oldest batch someone who is not (yet) a reader still needs: its slot is not reused.
    pub(super) floor: Option<u64>,
    /// The ring's file, for the readers [`RingProducer::add_reader`] adds (a ring this side
    /// created; `None` for a session's own ring).
    pub(super) memfd: Option<OwnedFd>,
}

impl RingProducer {
    /// Watches `peer` (the Unix socket to the consumer) for hang-up while waiting for a slot.
    pub fn set_peer(&mut self, peer: OwnedFd) {
        self.peer = Some(peer);
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Whether each batch carries its crc32c.
    pub fn checksums(&self) -> bool {
        self.checksums
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
        let head = self.head;
        loop {
            match self.room() {
                Room::Free => break,
                Room::Gone => return Err(RingError::ConsumerGone),
                Room::Full => {}
            }
            let ready = || self.room() != Room::Full;
            match wait(
                &self.map.header().producer_wakeup.0,
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
        let n = u64::from(self.layout.slot_count);
        self.reserved = true;
        let index = (head % n) as u32;
        let len = self.layout.slot_size as usize;
        // SAFETY: the slot is inside the mapping; `room` saw (Acquire) `head - tail < n` for
        // every active reader, so each released this slot and will not read it until we
        // publish it (a reader added later starts past it: `add_reader`); `&mut self` is borrowed by the guard, so there is one writer.
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
            crate::frame::payload_crc(data)
        } else {
            0
        };
        rec.crc.store(crc, Ordering::Relaxed);
        // The indices are free-running counters, and the consumer wrote the index this one
        // started from: `u64::MAX` must wrap, not panic (found by the `ring_header` fuzz
        // target).
        self.head = self.head.wrapping_add(1);
        self.reserved = false;
        hdr.producer.0.store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        for (r, reader) in self.readers.iter().enumerate() {
            let Reader::Active { wake } = reader else {
                continue;
            };
            let lines = self.map.reader(&self.layout, r as u32);
            if lines.consumer_wakeup.0.load(Ordering::Relaxed) != 0
                && self.head >= lines.consumer_wake_at.0.load(Ordering::Relaxed)
            {
                kick(wake);
            }
        }
    }

    /// The room the active readers (and the floor) leave for batch `head`. A reader that
    /// set `CONSUMER_CLOSED` no longer counts; its index is only ever compared, so whatever
    /// it wrote there holds up no one but the readers of this ring.
    fn room(&self) -> Room {
        let n = u64::from(self.layout.slot_count);
        let head = self.head;
        let mut any = false;
        for r in 0..self.readers.len() as u32 {
            let Some(lines) = self.live(r) else {
                continue;
            };
            any = true;
            if head.wrapping_sub(lines.consumer.0.load(Ordering::Acquire)) >= n {
                return Room::Full;
            }
        }
        if !any {
            return Room::Gone;
        }
        match self.floor {
            Some(f) if f <= head && head - f >= n => Room::Full,
            _ => Room::Free,
        }
    }

    /// Keeps the slot of batch `floor` and every later one from being reused (`None`: no
    /// floor): for a subscriber that will attach as a reader at `floor` but has not yet.
    pub fn set_floor(&mut self, floor: Option<u64>) {
        self.floor = floor;
    }

    /// The block of reader `reader` while it is active and has not set `CONSUMER_CLOSED`.
    fn live(&self, reader: u32) -> Option<&ReaderLines> {
        match self.readers.get(reader as usize) {
            Some(Reader::Active { .. }) => {
                let lines = self.map.reader(&self.layout, reader);
                (lines.closed.0.load(Ordering::Acquire) & CONSUMER_CLOSED == 0).then_some(lines)
            }
            _ => None,
        }
    }

    /// Whether reader `reader` is active and has not left.
    pub fn reader_active(&self, reader: u32) -> bool {
        self.live(reader).is_some()
    }

    /// Whether any reader is active and has not left.
    pub fn has_readers(&self) -> bool {
        (0..self.readers.len() as u32).any(|r| self.live(r).is_some())
    }

    /// Stops waiting for reader `reader`: it went away (its process, or its socket, is gone).
    /// Nothing is written to its block. A reader still alive loses what it had not taken;
    /// what it had taken it copied out before it let its socket go
    /// ([`RingConsumer::detach_all`](super::RingConsumer::detach_all)).
    pub fn end_reader(&mut self, reader: u32) {
        if let Some(slot) = self.readers.get_mut(reader as usize) {
            if matches!(slot, Reader::Active { .. }) {
                *slot = Reader::Ended;
            }
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
        if self.closed {
            return;
        }
        self.closed = true;
        for (r, reader) in self.readers.iter().enumerate() {
            let lines = self.map.reader(&self.layout, r as u32);
            lines.closed.0.fetch_or(bit, Ordering::Release);
            if let Reader::Active { wake } = reader {
                kick(wake);
            }
        }
    }
}

impl Drop for RingProducer {
    /// Dropped without [`close`](RingProducer::close): each reader reports
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
