//! Byte layout of the shared-memory ring, and the rules both sides follow to use it.
//!
//! ```text
//! offset 0      Meta           magic, version, slot count, slot size, offsets, total length,
//!                              flags, readers
//! offset 64     producer index (batches published; written only by the producer)
//! offset 128    producer need-wakeup flag (set/cleared by the producer, read by the readers)
//! offset 192    reader blocks, 256 bytes each, one per reader (`readers` of them):
//!   +0            consumer index (batches released; written only by this reader)
//!   +64           consumer need-wakeup flag (set/cleared by this reader, read by the producer)
//!   +128          closed flags (PRODUCER_CLOSED / PRODUCER_ABORTED by the producer,
//!                 CONSUMER_CLOSED by this reader)
//!   +192          consumer wake threshold (the producer index at which this reader, asleep,
//!                 wants its eventfd written; written by the reader, read by the producer)
//! after them    completion records, one per slot: seq u64, len u32, crc32c u32
//! page-aligned  slots: slot_count x slot_size bytes of payload
//! ```
//!
//! A ring the host creates for one session has one reader. A ring the agent creates for a
//! shared stream has one block per subscriber it may serve ([`MAX_READERS`]): the agent writes
//! each batch once, every subscriber on the host reads it in place, and a slot is reused only
//! once every reader has released it. Each reader has its own eventfd for wake-ups; the
//! producer's is shared. What follows is written for one reader and holds for each: the
//! producer's room is the room the slowest active reader leaves.
//!
//! Every index and flag lives on its own 64-byte cache line, so the producer's stores to its
//! index never invalidate the line the consumer polls for its own, and vice versa.
//!
//! # Memory ordering
//!
//! The indices are free-running `u64` counters; batch `seq` lives in slot `seq % slot_count`.
//! `producer - consumer` is the number of slots in use (`0..=slot_count`).
//!
//! * **Ownership.** Batch `seq` (in slot `seq % N`) belongs to the consumer while
//!   `consumer <= seq < producer`, and to the producer otherwise. The producer only writes the
//!   payload and completion record of slot `producer % N`, and only after it has observed (Acquire
//!   load of the consumer index) `producer - consumer < N`. The consumer only reads slot
//!   `consumer % N`, and only after it has observed (Acquire load of the producer index)
//!   `producer > consumer`.
//! * **Publish = Release.** The producer writes the payload, then the completion record
//!   (seq, len, crc), then stores `producer + 1` with Release. Release orders every earlier write
//!   before the index store; the consumer's Acquire load that sees the new index therefore also
//!   sees the payload and record. So a torn batch cannot be observed: the index moves only after
//!   the last payload byte was written, and a producer that dies before that store leaves the
//!   index where it was (the half-written slot is simply never published). The crc32c in the
//!   record is the second line of defence: against a buggy or hostile peer, not against
//!   reordering.
//! * **Release = Release.** The consumer finishes reading a slot, then stores `consumer + 1`
//!   with Release; the producer's Acquire load that sees it knows the consumer's reads are done,
//!   so overwriting the slot cannot race with them.
//! * **Need-wakeup (as AF_XDP).** A side about to sleep stores its need-wakeup flag, issues a
//!   SeqCst fence, and re-checks the other side's index; the other side stores its index, issues
//!   a SeqCst fence, and loads the flag. By the fence rules at least one of the two sees the
//!   other's store: either the sleeper sees the new index and does not sleep, or the waker sees
//!   the flag and writes the eventfd. No wakeup is lost, and a side that keeps up (never finds
//!   the ring empty/full) never sets the flag and the other side never makes a syscall for it.
//!   `ring::model` checks this protocol exhaustively on a small state machine.
//! * **Wake-up batching (interrupt moderation).** A consumer faster than its producer would
//!   otherwise sleep and be woken once per batch. Before setting its flag it stores a
//!   threshold `wake_at = consumer + k` (`1 <= k <= slot_count`), and the producer writes the
//!   eventfd only once its index reaches it; the consumer's re-check uses the same condition.
//!   The threshold is stored before the fence and read after the producer's, so the argument
//!   above holds with "index >= wake_at" in place of "index moved". Nothing can wait forever
//!   on it: a producer that publishes on reaches it, a full ring has `producer = consumer +
//!   slot_count >= wake_at`, and closing the ring always writes the eventfd. The consumer also
//!   bounds each such sleep with a short timeout, so a slow producer costs latency of at most
//!   that, never a stall.
//! * **Closing.** The producer sets `PRODUCER_CLOSED` with Release after its last publish; the
//!   consumer, after seeing it (Acquire), re-reads the producer index before reporting the end,
//!   so no published batch is lost behind the flag.
//!
//! The `Meta` block is written once by the creator before the file descriptor is shared and is
//! read once, copied and validated ([`Layout::validate`]) by the attaching side; neither side
//! trusts the other's numbers after that.

use std::mem::{align_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// `b"DQRING\0\x01"` read as little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"DQRING\0\x01");
/// Layout version; bumped on any incompatible change (3: reader blocks).
pub const VERSION: u32 = 3;
/// Default slot size: 1 MiB, the frame payload size of the stream transport.
pub const DEFAULT_SLOT_SIZE: u64 = 1 << 20;
/// Slots are page aligned.
pub const PAGE: u64 = 4096;
/// Most slots a ring may have.
pub const MAX_SLOTS: u32 = 1 << 16;
/// Most readers a ring may have.
pub const MAX_READERS: u32 = 64;
/// Largest index a reader joining a shared ring may start from. The indices are free-running
/// counts of batches, so a real ring never comes near it (2^63 batches); the reader's own
/// arithmetic (its index plus the slot count, plus a batch) then never overflows, whatever a
/// hostile agent wrote in the block (found by the `ring_answer` fuzz target).
pub const MAX_INDEX: u64 = i64::MAX as u64;

/// Bits of [`Header::closed`].
pub const PRODUCER_CLOSED: u32 = 1;
/// The producer went away without closing (dropped in-process); the consumer reports an error.
pub const PRODUCER_ABORTED: u32 = 2;
/// The consumer went away; the producer no longer waits for it (for the last reader: its
/// next wait fails).
pub const CONSUMER_CLOSED: u32 = 4;

/// Written once by the creator; plain data.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub magic: u64,
    pub version: u32,
    pub slot_count: u32,
    pub slot_size: u64,
    pub records_offset: u64,
    pub slots_offset: u64,
    pub total_len: u64,
    /// [`FLAG_CRC`] or 0; no other bits are defined.
    pub flags: u32,
    /// Reader blocks (`1..=MAX_READERS`).
    pub readers: u32,
}

/// Meta flag: the producer computes each batch's crc32c into its completion record and the
/// consumer checks it. Without it the record's crc is 0 and unchecked (sequence number and
/// length are always checked). The consumer chooses, when it creates the ring.
pub const FLAG_CRC: u32 = 1;

/// A value alone on a 64-byte cache line.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct CacheLine<T>(pub T);

/// The start of the shared mapping: what the producer writes for every reader.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    pub meta: Meta,
    /// Batches published (producer writes, Release).
    pub producer: CacheLine<AtomicU64>,
    /// Non-zero: the producer waits for a free slot and wants an eventfd write on release.
    pub producer_wakeup: CacheLine<AtomicU32>,
}

/// One reader's block (see the table above).
#[repr(C)]
#[derive(Debug)]
pub struct ReaderLines {
    /// Batches released (this reader writes, Release).
    pub consumer: CacheLine<AtomicU64>,
    /// Non-zero: the reader sleeps (or is about to) and wants an eventfd write on publish.
    pub consumer_wakeup: CacheLine<AtomicU32>,
    /// `PRODUCER_CLOSED | PRODUCER_ABORTED | CONSUMER_CLOSED`.
    pub closed: CacheLine<AtomicU32>,
    /// While the reader sleeps: the producer index at which to wake it.
    pub consumer_wake_at: CacheLine<AtomicU64>,
}

/// One per slot, written by the producer before it publishes the slot.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Record {
    pub seq: AtomicU64,
    pub len: AtomicU32,
    pub crc: AtomicU32,
}

/// Where things are, for a given slot count and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub slot_count: u32,
    pub slot_size: u64,
    pub readers: u32,
    pub records_offset: u64,
    pub slots_offset: u64,
    pub total_len: u64,
}

/// Why a layout is impossible or a header does not describe the file it is in.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("ring: slot count {0} out of range 1..={MAX_SLOTS}")]
    SlotCount(u32),
    #[error("ring: slot size {0} out of range 1..={max}", max = u32::MAX)]
    SlotSize(u64),
    #[error("ring: {0} readers, out of range 1..={MAX_READERS}")]
    Readers(u32),
    #[error("ring: {slots} slots of {slot_size} bytes overflow the address space")]
    Overflow { slots: u32, slot_size: u64 },
    #[error("ring header: memfd is {0} bytes, smaller than the {min}-byte header", min = size_of::<Header>())]
    TooSmall(u64),
    #[error("ring header: bad magic {found:#018x} (expected {MAGIC:#018x})")]
    Magic { found: u64 },
    #[error("ring header: version {found} not supported (expected {VERSION})")]
    Version { found: u32 },
    #[error("ring header: unknown flags {found:#x} (known: {FLAG_CRC:#x})")]
    Flags { found: u32 },
    #[error("ring header: field {field} is {found}, expected {expected} for {slots} slots of {slot_size} bytes")]
    Field {
        field: &'static str,
        found: u64,
        expected: u64,
        slots: u32,
        slot_size: u64,
    },
    #[error("ring header: {0} reader blocks; a session's own ring has 1")]
    NotOneReader(u32),
    #[error("ring header: memfd is {actual} bytes but the header describes {expected} bytes")]
    FileSize { actual: u64, expected: u64 },
}

const _: () = {
    assert!(size_of::<Meta>() == 64);
    assert!(size_of::<Header>() == 3 * 64);
    assert!(size_of::<ReaderLines>() == 4 * 64);
    assert!(align_of::<Header>() == 64);
    assert!(size_of::<Record>() == 16);
};

fn round_up(x: u64, to: u64) -> Option<u64> {
    x.checked_add(to - 1).map(|v| v / to * to)
}

impl Layout {
    /// The layout for `slot_count` slots of `slot_size` bytes and one reader.
    pub fn new(slot_count: u32, slot_size: u64) -> Result<Layout, LayoutError> {
        Self::with_readers(slot_count, slot_size, 1)
    }

    /// The layout for `slot_count` slots of `slot_size` bytes and `readers` reader blocks.
    pub fn with_readers(
        slot_count: u32,
        slot_size: u64,
        readers: u32,
    ) -> Result<Layout, LayoutError> {
        if readers == 0 || readers > MAX_READERS {
            return Err(LayoutError::Readers(readers));
        }
        if slot_count == 0 || slot_count > MAX_SLOTS {
            return Err(LayoutError::SlotCount(slot_count));
        }
        if slot_size == 0 || slot_size > u64::from(u32::MAX) {
            return Err(LayoutError::SlotSize(slot_size));
        }
        let records_offset =
            (size_of::<Header>() + readers as usize * size_of::<ReaderLines>()) as u64;
        let overflow = LayoutError::Overflow {
            slots: slot_count,
            slot_size,
        };
        let records_end = records_offset + u64::from(slot_count) * size_of::<Record>() as u64;
        let slots_offset = round_up(records_end, PAGE).ok_or(overflow.clone())?;
        let total_len = u64::from(slot_count)
            .checked_mul(slot_size)
            .and_then(|b| b.checked_add(slots_offset))
            .filter(|&t| usize::try_from(t).is_ok() && t <= i64::MAX as u64)
            .ok_or(overflow)?;
        Ok(Layout {
            slot_count,
            slot_size,
            readers,
            records_offset,
            slots_offset,
            total_len,
        })
    }

    /// The header the creator writes, with `flags`.
    pub fn meta(&self, flags: u32) -> Meta {
        Meta {
            flags,
            readers: self.readers,
            magic: MAGIC,
            version: VERSION,
            slot_count: self.slot_count,
            slot_size: self.slot_size,
            records_offset: self.records_offset,
            slots_offset: self.slots_offset,
            total_len: self.total_len,
        }
    }

    /// Checks a header copied out of a peer's file of `file_len` bytes. Never trusts the peer:
    /// every field is recomputed from slot count and size and compared, and the file must be
    /// exactly as long as the header says.
    pub fn validate(meta: &Meta, file_len: u64) -> Result<Layout, LayoutError> {
        if file_len < size_of::<Header>() as u64 {
            return Err(LayoutError::TooSmall(file_len));
        }
        if meta.magic != MAGIC {
            return Err(LayoutError::Magic { found: meta.magic });
        }
        if meta.version != VERSION {
            return Err(LayoutError::Version {
                found: meta.version,
            });
        }
        if meta.flags & !FLAG_CRC != 0 {
            return Err(LayoutError::Flags { found: meta.flags });
        }
        let layout = Layout::with_readers(meta.slot_count, meta.slot_size, meta.readers)?;
        for (field, found, expected) in [
            ("records_offset", meta.records_offset, layout.records_offset),
            ("slots_offset", meta.slots_offset, layout.slots_offset),
            ("total_len", meta.total_len, layout.total_len),
        ] {
            if found != expected {
                return Err(LayoutError::Field {
                    field,
                    found,
                    expected,
                    slots: layout.slot_count,
                    slot_size: layout.slot_size,
                });
            }
        }
        if file_len != layout.total_len {
            return Err(LayoutError::FileSize {
                actual: file_len,
                expected: layout.total_len,
            });
        }
        Ok(layout)
    }

    /// Byte offset of slot `index` (`index < slot_count`).
    pub fn slot_offset(&self, index: u32) -> u64 {
        self.slots_offset + u64::from(index) * self.slot_size
    }

    /// Byte offset of reader `reader`'s block (`reader < readers`).
    pub fn reader_offset(&self, reader: u32) -> u64 {
        (size_of::<Header>() + reader as usize * size_of::<ReaderLines>()) as u64
    }

    /// Byte offset of the completion record of slot `index`.
    pub fn record_offset(&self, index: u32) -> u64 {
        self.records_offset + u64::from(index) * size_of::<Record>() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout() {
        let l = Layout::new(4, DEFAULT_SLOT_SIZE).unwrap();
        assert_eq!(l.records_offset, 448);
        assert_eq!(l.reader_offset(0), 192);
        let three = Layout::with_readers(4, DEFAULT_SLOT_SIZE, 3).unwrap();
        assert_eq!(three.records_offset, 192 + 3 * 256);
        assert_eq!(Layout::validate(&three.meta(0), three.total_len), Ok(three));
        assert_eq!(
            Layout::with_readers(4, 4096, 65).unwrap_err().to_string(),
            "ring: 65 readers, out of range 1..=64"
        );
        assert_eq!(l.slots_offset, 4096);
        assert_eq!(l.total_len, 4096 + 4 * (1 << 20));
        assert_eq!(Layout::validate(&l.meta(FLAG_CRC), l.total_len), Ok(l));
    }

    #[test]
    fn rejects() {
        assert_eq!(Layout::new(0, 1), Err(LayoutError::SlotCount(0)));
        assert_eq!(Layout::new(1, 0), Err(LayoutError::SlotSize(0)));
        let l = Layout::new(2, 100).unwrap();
        let mut m = l.meta(FLAG_CRC);
        m.slots_offset = 0;
        assert_eq!(
            Layout::validate(&m, l.total_len).unwrap_err().to_string(),
            "ring header: field slots_offset is 0, expected 4096 for 2 slots of 100 bytes"
        );
        assert_eq!(
            Layout::validate(&l.meta(FLAG_CRC), l.total_len + 1)
                .unwrap_err()
                .to_string(),
            "ring header: memfd is 4297 bytes but the header describes 4296 bytes"
        );
        m = l.meta(FLAG_CRC);
        m.magic = 7;
        assert_eq!(
            Layout::validate(&m, l.total_len).unwrap_err().to_string(),
            "ring header: bad magic 0x0000000000000007 (expected 0x0100474e49525144)"
        );
    }
}
