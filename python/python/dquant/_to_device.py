"""``dquant.torch.DataLoader(device=...)``: batches handed to the loop in device memory,
copied there through pinned staging buffers the loader keeps.

Why: on a trainer host the batch's hop into GPU memory costs the loop more than dquant's
whole read. ``pin_memory`` copies each tensor into a fresh pinned block (a pinned allocation
each batch), then the loop copies it again to the device. Here each batch's memory is copied
once into a pinned buffer the loader reuses; ``input_ids`` and ``labels`` are views of one
buffer, so one copy serves both. The buffer then goes to the device asynchronously on the
stream that is current when the loop takes the batch, so the loop's own work on it is ordered
after the copy with no stream switch or cross-stream wait. On an H100 host (``bench/gpu``, the
``gpu_feed`` area) this ran 1.9x the rate of ``pin_memory`` and the loop's copy in process,
1.2-1.8x with workers and 1.5x from an agent; the first version, which copied on a stream of
its own (a wait on it and ``record_stream`` each batch), ran at 0.65x.

A staging buffer is written again only after the device finished copying out of it (an event
recorded after the copy), so a batch the loop holds never changes. Tensors that share memory
in the batch share it on the device too, with the same shapes, strides and offsets.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Tuple

import torch

# Staging buffers in turn: a buffer is reused four batches later, long after its copy ended
# unless the device is that far behind.
DEPTH = 4

# A staged region starts and ends on this boundary (the largest element size, complex128's;
# never across a page, so the few bytes read past a batch are mapped), so each tensor's
# offset in it, and its length, are whole numbers of its elements.
ALIGN = 16


def _span(t: torch.Tensor) -> Tuple[int, int]:
    """The addresses of the bytes tensor `t` reads: `[start, end)`."""
    size = t.element_size()
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return start, start + (last + 1) * size


# A tensor of a batch, with the addresses of its bytes and whether its address is a multiple
# of its element size: (start, end, aligned, key, tensor).
Entry = Tuple[int, int, bool, str, torch.Tensor]


def _overlapping(entries: List[Entry]) -> List[List[Entry]]:
    """`entries` in groups whose bytes overlap (input_ids and labels, views of one buffer
    through two tensors of their own)."""
    groups: List[List[Entry]] = []
    end = -1
    for e in sorted(entries, key=lambda e: (e[0], e[1])):
        start, stop, aligned = e[0], e[1], e[2]
        # A tensor at an address that is not a multiple of its element size (never one of
        # dquant's) goes alone, from its own first byte.
        if groups and start < end and aligned and all(g[2] for g in groups[-1]):
            groups[-1].append(e)
            end = max(end, stop)
        else:
            groups.append([e])
            end = stop
    return groups


def _copied(lo: int, hi: int, into: torch.Tensor) -> torch.Tensor:
    """The host memory `[lo, hi)` copied into the start of the byte tensor `into` (its first
    `hi - lo` bytes, returned). One `memmove` on this thread: torch's own copy splits a buffer
    this size over its intra-op threads, which measured 6x slower on 2 busy cores."""
    out = into[: hi - lo]
    if hi > lo:
        ctypes.memmove(out.data_ptr(), lo, hi - lo)
    return out


def _view(region: torch.Tensor, t: torch.Tensor, offset: int) -> torch.Tensor:
    """A tensor with `t`'s dtype, shape and strides over the bytes of `region` from `offset`:
    a typed view of the region (one view op, no tensor made empty first and its storage set:
    on the GPU host 67 against 74 us a batch, `bench/gpu/staging.py`). The region
    holds whole elements of `t` from `offset` on: a group's region starts and ends on
    `ALIGN`, and a tensor staged alone starts it."""
    size = t.element_size()
    return region.view(t.dtype).as_strided(t.shape, t.stride(), offset // size)


class ToDevice:
    """Moves batches (dicts whose tensors are in host memory) to `device`, keeping which of
    their tensors share memory. On a CUDA device through pinned staging buffers, on the current
    stream; on any other, by a plain copy into memory of the batch's own."""

    def __init__(self, device: Any) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: this process sees no CUDA device")
        self.staging: List[Optional[torch.Tensor]] = [None] * DEPTH
        # An event a buffer, recorded again each time it is copied from: one made each batch
        # cost 98 against 67 us a batch on the GPU host (`bench/gpu/staging.py`). Waiting on
        # one never recorded returns at once (torch makes the CUDA event at its first record).
        self.done = [torch.cuda.Event() for _ in range(DEPTH)] if self.cuda else []
        self.turn = 0

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        entries: List[Entry] = []
        moved: Dict[str, Any] = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                start, stop = _span(value)
                entries.append((start, stop, start % value.element_size() == 0, key, value))
            else:
                moved[key] = value
        for group in _overlapping(entries):
            moved.update(self._move(group))
        return {key: moved[key] for key in batch}

    def _move(self, group: List[Entry]) -> Dict[str, torch.Tensor]:
        """Tensors whose bytes overlap, copied to the device as one region."""
        lo, hi = min(e[0] for e in group), max(e[1] for e in group)
        if all(e[2] for e in group):
            lo, hi = lo // ALIGN * ALIGN, -(-hi // ALIGN) * ALIGN
        region = self._to_device(lo, hi)
        return {key: _view(region, t, start - lo) for start, _, _, key, t in group}

    def _to_device(self, lo: int, hi: int) -> torch.Tensor:
        """The host memory `[lo, hi)` in device memory, ready on the current stream."""
        n = hi - lo
        if not self.cuda:
            here = _copied(lo, hi, torch.empty(n, dtype=torch.uint8))
            return here if self.device.type == "cpu" else here.to(self.device)
        turn = self.turn
        self.turn = (turn + 1) % DEPTH
        self.done[turn].synchronize()
        buf = self.staging[turn]
        if buf is None or buf.numel() < n:
            buf = self.staging[turn] = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        stage = _copied(lo, hi, buf)
        # On the current stream (see the module's doc): no stream switch, no cross-stream wait,
        # no record_stream.
        dev = stage.to(self.device, non_blocking=True)
        self.done[turn].record()
        return dev
