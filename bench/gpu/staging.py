#!/usr/bin/env python3
"""Microseconds a batch for `DataLoader(device=...)`'s hop into GPU memory, by part: the
loader's staging (`dquant._to_device.ToDevice`) against variants of it, on batches the loader
already made, measured in the same run.

Why: in `gpu_feed`, `device=` adds ~30 us a batch over the loader's own rate where a loop that
copies each batch into three pinned buffers it keeps adds ~8 us. This splits that gap into its
parts (the staging copy, the views, the CUDA event) so that a change to `ToDevice` is chosen by
measurement on the GPU host, not by guess. Run it there (see bench/gpu/run.sh):

    PYTHONPATH=.dev-gpu/python python3 bench/gpu/staging.py [--batches 64] [--reps 30]

Each variant is timed over the same held batches in turn (more than the caches hold), ended
by a device synchronize; wall and CPU microseconds a batch, best of --runs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import benchlib  # noqa: E402
import feed  # noqa: E402

import dquant.torch as dqt  # noqa: E402
from dquant import _to_device as td  # noqa: E402


class EmptySet(td.ToDevice):
    """The views as first merged: a tensor made empty, then its storage set to the region."""

    def _move(self, group):
        lo = min(e[0] for e in group) // td.ALIGN * td.ALIGN
        region = self._to_device(lo, max(e[1] for e in group))
        out = {}
        for start, _, _, key, t in group:
            view = torch.empty(0, dtype=t.dtype, device=self.device)
            view.set_(region.untyped_storage(), (start - lo) // t.element_size(), t.shape, t.stride())
            out[key] = view
        return out


class NewEvents(td.ToDevice):
    """A CUDA event made each batch (as first merged), not one a buffer recorded again."""

    def _to_device(self, lo, hi):
        if self.cuda:
            # Waited on here, then replaced: the base class waits on a fresh event, at once.
            self.done[self.turn].synchronize()
            self.done[self.turn] = torch.cuda.Event()
        return super()._to_device(lo, hi)


class TorchCopy(td.ToDevice):
    """Staged by torch's copy_ (its intra-op threads), not one memmove on the loop's thread."""

    def _to_device(self, lo, hi):
        saved, td._copied = td._copied, self._copied
        try:
            return super()._to_device(lo, hi)
        finally:
            td._copied = saved

    @staticmethod
    def _copied(lo, hi, into):
        # input_ids and labels come from numpy views with storages of their own: the region
        # is wrapped from its address.
        src = torch.frombuffer((ctypes.c_uint8 * (hi - lo)).from_address(lo), dtype=torch.uint8)
        return into[: hi - lo].copy_(src)


def staged_loop(device):
    """What feed.py's staged row does a batch: two copy_ into kept pinned tensors, an event,
    and the loop's two copies to the device."""
    state = {"bufs": None, "i": 0, "done": [None] * 3}

    def f(b):
        if state["bufs"] is None:
            state["bufs"] = [[torch.empty_like(b["input_ids"]).pin_memory() for _ in range(2)]
                             for _ in range(3)]
        slot = state["i"] % 3
        state["i"] += 1
        if state["done"][slot] is not None:
            state["done"][slot].synchronize()
        x, y = state["bufs"][slot]
        x.copy_(b["input_ids"])
        y.copy_(b["labels"])
        out = {"input_ids": x.to(device, non_blocking=True), "labels": y.to(device, non_blocking=True)}
        state["done"][slot] = torch.cuda.Event()
        state["done"][slot].record()
        return out

    return f


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def parts(device):
    """The merged staging's steps alone, each over one pinned buffer: the memmove, the copy
    to the device, and both with an event recorded and waited on DEPTH batches later."""
    buf = torch.empty(1 << 24, dtype=torch.uint8, pin_memory=torch.cuda.is_available())

    def region(b):
        lo, _ = td._span(b["input_ids"])
        _, hi = td._span(b["labels"])
        return lo, hi

    def memmove(b):
        lo, hi = region(b)
        td._copied(lo, hi, buf)

    def h2d(b):
        lo, hi = region(b)
        return buf[: hi - lo].to(device, non_blocking=True)

    def both(b):
        memmove(b)
        return h2d(b)

    kept = torch.empty(1 << 24, dtype=torch.uint8, device=device)

    def h2d_into(b):
        lo, hi = region(b)
        kept[: hi - lo].copy_(buf[: hi - lo], non_blocking=True)

    return {"part: memmove into pinned only": memmove, "part: pinned to device only (.to)": h2d,
            "part: pinned into a kept device tensor (copy_)": h2d_into,
            "part: memmove + .to, no event": both}


def timed(f, batches, reps: int) -> tuple[float, float]:
    for b in batches[:8]:
        f(b)
    sync()
    c0, t0 = benchlib.self_cpu_s(), time.perf_counter()
    for _ in range(reps):
        for b in batches:
            f(b)
    sync()
    n = reps * len(batches)
    return (time.perf_counter() - t0) / n * 1e6, (benchlib.self_cpu_s() - c0) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=64, help="batches held and cycled through")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        corpus = Path(d) / "corpus.bin"
        feed.make_corpus(corpus, (a.batches + 1) * a.batch_size * a.seq_len + 1)
        plan = {"sources": [{"uri": str(corpus), "dtype": "int32"}], "seq_len": a.seq_len,
                "batch_size": a.batch_size, "shuffle": False, "output": "i64"}
        batches = list(dqt.DataLoader(dqt.TokenDataset(plan)))[: a.batches]
    variants = {
        "loop's staged copies (feed.py staged row + its .to)": staged_loop(a.device),
        "ToDevice as it is": td.ToDevice(a.device),
        "views made empty, then set (as first merged)": EmptySet(a.device),
        "an event made each batch (as first merged)": NewEvents(a.device),
        "torch copy_ in place of the memmove": TorchCopy(a.device),
        "no copy at all (a dict of the batch)": lambda b: dict(b),
        **parts(a.device),
    }
    out = {"threads": torch.get_num_threads(), "rows": {}}
    for name, f in variants.items():
        try:
            runs = [timed(f, batches, a.reps) for _ in range(a.runs)]
        except Exception as e:  # a variant that fails on this host is reported, not fatal
            out["rows"][name] = {"error": repr(e)}
            print(f"{name:55s} failed: {e!r}", flush=True)
            continue
        wall, cpu = min(runs)
        out["rows"][name] = {"wall_us": round(wall, 2), "cpu_us": round(cpu, 2),
                             "runs_wall_us": [round(r[0], 2) for r in runs]}
        print(f"{name:55s} {wall:8.2f} us/batch wall {cpu:8.2f} us CPU", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
