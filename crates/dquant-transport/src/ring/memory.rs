//! The ring's memory as each process maps it. Both sides map the whole memfd once ([`Map`]):
//! header and completion records are atomics, slots plain bytes at fixed offsets. The consumer
//! needs more ([`ConsumerMem`]) because a batch view may outlive the batch's turn in the ring:
//! detaching it moves a private copy over the view's address with `mremap` and maps the slot
//! afresh, so the view keeps its bytes where it has always read them and the producer gets
//! the slot back.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rustix::mm::{MapFlags, ProtFlags};

use super::layout::{Header, Layout, LayoutError, ReaderLines, Record};
use super::{io_err, lock, RingConsumer, RingError};

/// A read-write shared mapping of the whole memfd.
pub(super) struct Map {
    pub(super) ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all cross-thread access to it goes through
// atomics (header, records) or through the slot ownership protocol documented in `layout`.
unsafe impl Send for Map {}
// SAFETY: as above; `&Map` hands out only `&Header` (atomics) and raw pointers.
unsafe impl Sync for Map {}

impl Map {
    /// Maps `len` bytes of `fd` from `offset` (page aligned).
    pub(super) fn new(fd: &OwnedFd, offset: u64, len: u64) -> Result<Map, RingError> {
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

    pub(super) fn header(&self) -> &Header {
        // SAFETY: the mapping is page aligned and at least `size_of::<Header>()` long (checked
        // by `Layout::new`/`validate` before mapping); `Header` is repr(C) of plain integers and
        // atomics, valid for any bit pattern.
        unsafe { &*self.ptr.as_ptr().cast::<Header>() }
    }

    pub(super) fn reader(&self, layout: &Layout, reader: u32) -> &ReaderLines {
        assert!(
            reader < layout.readers,
            "reader {reader} of {}",
            layout.readers
        );
        // SAFETY: the block lies inside the validated layout (checked above), is 64-byte
        // aligned (192 + 256 r) and `ReaderLines` is atomics, valid for any bit pattern.
        unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(layout.reader_offset(reader) as usize)
                .cast::<ReaderLines>()
        }
    }

    pub(super) fn record(&self, layout: &Layout, index: u32) -> &Record {
        debug_assert!(index < layout.slot_count);
        // SAFETY: `record_offset(index)` plus 16 bytes lies inside the validated layout, is
        // 16-byte aligned (192 + 256 r + 16 i), and `Record` is valid for any bit pattern.
        unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(layout.record_offset(index) as usize)
                .cast::<Record>()
        }
    }

    pub(super) fn slot_ptr(&self, layout: &Layout, index: u32) -> *mut u8 {
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

/// A batch's status on the consumer side, kept per slot as `seq << 2 | status`, so that the
/// view of an old batch can never be taken for a newer batch in the same slot.
pub(super) const VIEW_HELD: u64 = 1;
pub(super) const VIEW_RELEASED: u64 = 2;
pub(super) const VIEW_DETACHED: u64 = 3;

pub(super) fn view_state(seq: u64, status: u64) -> u64 {
    seq << 2 | status
}

/// Memory a detached view owns: a private copy of its batch at the address the view has
/// always read (see [`RingConsumer`] on detaching).
pub(super) struct Region {
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
    pub(super) fn free(self) {
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

/// The consumer's mappings, shared with every [`RingView`](super::RingView) so that a view
/// keeps its memory after the consumer is gone.
pub(super) struct ConsumerMem {
    /// The whole file, mapped once: header, records and, at first, every slot.
    pub(super) file: Map,
    pub(super) layout: Layout,
    /// Which reader block is this consumer's.
    pub(super) reader: u32,
    /// A duplicate of the memfd, to map a slot afresh after a detach.
    pub(super) memfd: OwnedFd,
    /// Where the ring reads each slot now: `None` in `file`, else a mapping of its own.
    pub(super) slots: Mutex<Vec<Option<Map>>>,
    /// Per slot, the status of the batch last taken from it ([`view_state`]).
    pub(super) state: Box<[AtomicU64]>,
    /// The copies that detached views read, by sequence number.
    pub(super) detached: Mutex<HashMap<u64, Region>>,
}

impl ConsumerMem {
    /// This consumer's reader block.
    pub(super) fn lines(&self) -> &ReaderLines {
        self.file.reader(&self.layout, self.reader)
    }

    pub(super) fn slot_ptr(&self, index: u32) -> *mut u8 {
        self.slot_in(&lock(&self.slots), index)
    }

    /// Where the ring reads slot `index`, given the (locked) per-slot mappings.
    fn slot_in(&self, slots: &[Option<Map>], index: u32) -> *mut u8 {
        match &slots[index as usize] {
            Some(m) => m.ptr.as_ptr(),
            None => self.file.slot_ptr(&self.layout, index),
        }
    }

    pub(super) fn state(&self, seq: u64) -> &AtomicU64 {
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

impl RingConsumer {
    /// Gives the live view of batch `seq` a private copy at its own address and maps the
    /// slot afresh for the ring; the batch then counts as released.
    pub(super) fn detach(&mut self, seq: u64) -> Result<(), RingError> {
        let mem = &*self.mem;
        let index = (seq % u64::from(mem.layout.slot_count)) as u32;
        let size = mem.layout.slot_size as usize;
        // The producer may have rewritten the record since the batch was taken (it is shared
        // memory, and the producer is not trusted): its length is only a hint of how much of
        // the slot to copy, never more than the slot (found by the `ring_consumer` fuzz
        // target: a length of 2^32 - 1 copied gigabytes past the mapping).
        let len = (mem
            .file
            .record(&mem.layout, index)
            .len
            .load(Ordering::Relaxed) as usize)
            .min(size);
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
        // SAFETY: `old` is a slot of `size >= len` bytes, and `copy` a fresh mapping of `size`
        // bytes; a producer that writes the slot while the view pins it changes what the
        // view reads, never where.
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
