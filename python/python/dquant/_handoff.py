"""Batches from DataLoader workers to the main process through shared memory, read in place.

torch moves a worker's batch to the main process by pickling it: each tensor's storage is
moved into a new shared-memory segment (or, if it is shared already, its descriptor is passed
over a Unix socket) and the main process maps it. That costs about a millisecond a batch
whatever its size: at 16 K tokens a batch it caps one worker near 12 M tokens/s, 15 times
slower than reading the same plan in-process.

Here a worker copies each batch (every tensor of the item, views kept as views) into one slot
of an arena it maps once, a memfd, and what crosses torch's queue is the slot's number and
layout: a few hundred bytes. Unpickling it in the main process (torch's DataLoader and
:class:`dquant.torch.DataLoader` alike, in whichever thread unpickles) maps the worker's arena
once, through ``/proc/PID/fd``, and rebuilds the item as tensors viewing the slot. The slot
goes back to the worker when the last of those tensors is freed: its owner's finalizer writes
the slot's number into a pipe the worker reads (a syscall on each side, which orders the main
process's reads of the slot before the worker's next writes). A worker with no free slot (the
training loop holds many batches) hands that batch over pickled whole instead (torch's way,
or over dquant's worker socket, see :mod:`dquant._workers`), so nothing waits and nothing is
lost.

``DQUANT_WORKER_SHM=0`` turns the hand-over off (every batch goes torch's way).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

# Slots in a worker's arena: torch keeps up to prefetch_factor (2) batches a worker in
# flight, the loop holds one or two, pin_memory one more; the rest is room for a loop that
# keeps a few batches (a gradient-accumulation step) before any goes torch's way. Fewer for
# large batches, so that an arena stays within ARENA_BYTES (but never under MIN_SLOTS).
SLOTS = 12
MIN_SLOTS = 4
ARENA_BYTES = 64 << 20
# Regions in a slot start on this boundary (the strictest dtype alignment, and a cache line).
ALIGN = 64
# Room for batches larger than the first (cu_seqlens grows with the documents of a batch).
HEADROOM = 1.25

_log = logging.getLogger("dquant")

_DTYPES = {
    str(d): d
    for d in (torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32,
              torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
              torch.bool)
}


def enabled() -> bool:
    """Whether workers hand batches over through shared memory (``DQUANT_WORKER_SHM``)."""
    return os.environ.get("DQUANT_WORKER_SHM", "1") not in ("0", "false", "no", "off")


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Region:
    """Memory of the item that lands in one span of a slot: storages that overlap (views of
    one batch made separately, as ``torch.from_numpy`` makes ``input_ids`` and ``labels``)
    share a region, so they stay views of one memory after the hand-over."""

    def __init__(self, start: int):
        self.start = self.end = start
        # (address of bytes of a storage past what the region holds already, how many, their
        # offset in the region)
        self.pieces: List[Tuple[int, int, int]] = []
        self.offset = 0  # in the slot

    def add(self, ptr: int, n: int) -> int:
        """Takes in the ``n`` bytes of a storage at ``ptr`` (at or after the region's start);
        returns where they start in the region."""
        if ptr + n > self.end:
            skip = max(self.end - ptr, 0)
            self.pieces.append((ptr + skip, n - skip, ptr + skip - self.start))
            self.end = ptr + n
        return ptr - self.start


def _layout(item: Dict[str, Any]) -> Tuple[List[_Region], list, dict, int]:
    """Where each tensor of ``item`` goes in a slot: the regions of memory it takes (see
    :class:`_Region`), each tensor's place in them, the item's other values, and the bytes
    the slot needs."""
    plain = {}
    found = []
    for key, value in item.items():
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            found.append((value.untyped_storage().data_ptr(), key, value))
        else:
            plain[key] = value
    regions: List[_Region] = []
    tensors = []
    for ptr, key, value in sorted(found, key=lambda f: f[0]):
        if not regions or ptr >= regions[-1].end:
            regions.append(_Region(ptr))
        storage = value.untyped_storage()
        at = regions[-1].add(ptr, storage.nbytes())
        tensors.append((key, len(regions) - 1, at, storage.nbytes(), str(value.dtype),
                        tuple(value.shape), value.stride(), value.storage_offset()))
    size = 0
    for r in regions:
        r.offset = size
        size = _aligned(size + r.end - r.start)
    return regions, tensors, plain, size


class Arena:
    """A worker's slots: a memfd it maps once, and the pipe its free slots come back on."""

    def __init__(self, slot_size: int, slots: int = SLOTS):
        self.slot_size = slot_size
        self.slots = slots
        self.fd = os.memfd_create("dquant-worker-batches", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, slot_size * slots)
        self.map = mmap.mmap(self.fd, slot_size * slots)
        # The map's address, for memmove (the export lives as long as the arena).
        self.view = ctypes.c_char.from_buffer(self.map)
        self.address = ctypes.addressof(self.view)
        self.freed, self.free_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.free = list(range(slots))
        self.key = (os.getpid(), os.fstat(self.fd).st_ino)

    def take(self) -> Optional[int]:
        """A free slot, or ``None`` when every one is still in the main process's hands."""
        if not self.free:
            try:
                back = os.read(self.freed, 4 * self.slots)
            except BlockingIOError:
                back = b""
            self.free.extend(int.from_bytes(back[i:i + 4], "little")
                             for i in range(0, len(back) - 3, 4))
        return self.free.pop() if self.free else None

    def put(self, item: Dict[str, Any]) -> Optional["SlotItem"]:
        """``item`` copied into a free slot, as what crosses torch's queue instead; ``None``
        when it does not fit or no slot is free (the caller sends the item itself)."""
        regions, tensors, plain, size = _layout(item)
        if size > self.slot_size:
            return None
        slot = self.take()
        if slot is None:
            return None
        base = self.address + slot * self.slot_size
        for r in regions:
            for src, n, at in r.pieces:
                # The item's tensors hold these bytes alive for the length of the call.
                ctypes.memmove(base + r.offset + at, src, n)
        where = (self.key, self.fd, self.free_w, self.slot_size * self.slots)
        return SlotItem(item, where, slot, self.slot_size, [r.offset for r in regions],
                        [r.end - r.start for r in regions], tensors, plain)


def arena_for(item: Dict[str, Any]) -> Arena:
    """An arena whose slots hold ``item`` with room to spare."""
    size = _layout(item)[3]
    slot = -(-int(size * HEADROOM + 4096) // mmap.PAGESIZE) * mmap.PAGESIZE
    return Arena(slot, max(MIN_SLOTS, min(SLOTS, ARENA_BYTES // slot)))


class SlotItem(dict):
    """A batch in a worker's slot. In the worker it is the item itself (a dict of the same
    tensors, so a ``collate_fn`` sees what it always saw; one that makes a new dict sends that
    torch's way); pickled, it is the slot's number and layout; unpickled in the main process,
    the batch's tensors viewing the slot."""

    def __init__(self, item, where, slot, slot_size, offsets, lengths, tensors, plain):
        super().__init__(item)
        self.args = (where, slot, slot_size, offsets, lengths, tensors, plain)

    def __reduce__(self):
        return (_rebuild, self.args)

    def __copy__(self):
        # torch's default_convert copies a mutable mapping, then updates the copy.
        return SlotItem(self, *self.args)


# -- the main process -------------------------------------------------------------------------

_arenas: Dict[Tuple[int, int], "_Mapped"] = {}
_lock = threading.Lock()
# Batches rebuilt from slots in this process (the tests' proof that the hand-over ran).
rebuilt = 0


class _Mapped:
    """A worker's arena as the main process maps it, and its free-slot pipe."""

    def __init__(self, pid: int, fd: int, free_w: int, length: int):
        self.free_w = -1
        try:
            mfd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
            try:
                self.map = mmap.mmap(mfd, length)
            finally:
                os.close(mfd)
            self.free_w = os.open(f"/proc/{pid}/fd/{free_w}", os.O_WRONLY | os.O_CLOEXEC)
        except OSError as e:
            raise RuntimeError(
                f"dquant: cannot map the batches of DataLoader worker {pid} "
                f"(/proc/{pid}/fd: {e}); set DQUANT_WORKER_SHM=0 to hand them over torch's way"
            ) from e
        self.slot_types: Dict[int, type] = {}

    def give_back(self, slot: int) -> None:
        # Called from a finalizer, in whichever thread freed the last tensor: it must not
        # raise. A worker that is gone (EPIPE) needs its slot no more.
        try:
            os.write(self.free_w, slot.to_bytes(4, "little"))
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.EBADF):
                _log.warning("dquant: cannot give slot %d back to its worker: %s", slot, e)

    def slot(self, slot: int, slot_size: int):
        """The slot's memory, as an object whose end gives the slot back."""
        cls = self.slot_types.get(slot_size)
        if cls is None:
            mapped = self

            class Slot(ctypes.c_uint8 * slot_size):
                def __del__(self):
                    mapped.give_back(self.index)

            cls = self.slot_types[slot_size] = Slot
        owner = cls.from_buffer(self.map, slot * slot_size)
        owner.index = slot
        return owner

    def __del__(self):
        if self.free_w >= 0:
            try:
                os.close(self.free_w)
            except OSError:
                pass


def _mapped(where) -> _Mapped:
    key, fd, free_w, length = where
    with _lock:
        m = _arenas.get(key)
        if m is None:
            if len(_arenas) >= 64:  # arenas of workers long gone
                _arenas.pop(next(iter(_arenas)))
            m = _arenas[key] = _Mapped(key[0], fd, free_w, length)
        return m


def _rebuild(where, slot, slot_size, offsets, lengths, tensors, plain) -> Dict[str, Any]:
    global rebuilt
    owner = _mapped(where).slot(slot, slot_size)
    # One tensor over each region per dtype, that the region's tensors of that dtype view:
    # views of one storage before the hand-over stay views of one after it.
    bases: Dict[Tuple[int, str], torch.Tensor] = {}
    item = {}
    for key, index, at, nbytes, dtype, shape, stride, offset in tensors:
        dt = _DTYPES[dtype]
        size = dt.itemsize
        if at % size == 0 and lengths[index] >= size:
            base = bases.get((index, dtype))
            if base is None:
                base = bases[(index, dtype)] = torch.frombuffer(
                    owner, dtype=dt, count=lengths[index] // size, offset=offsets[index]
                )
            item[key] = base.as_strided(shape, stride, at // size + offset)
            continue
        # A storage that starts between the dtype's elements, or holds less than one.
        raw = torch.frombuffer(owner, dtype=torch.uint8, count=lengths[index], offset=offsets[index]) \
            if lengths[index] else torch.empty(0, dtype=torch.uint8)
        storage = raw[at:at + nbytes].view(dt)
        # as_strided's offset counts from the start of the memory, not of the slice.
        item[key] = storage.as_strided(shape, stride, storage.storage_offset() + offset)
    item.update(plain)
    rebuilt += 1
    return item
