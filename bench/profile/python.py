#!/usr/bin/env python3
"""The Python cases bench/profile samples: dquant.torch.TokenDataset over a Megatron corpus,
read the way bench/python's rows read it, one case after another while `perf record -a -k
CLOCK_MONOTONIC` samples every CPU. Writes JSON: each case's window on CLOCK_MONOTONIC, its
tokens, this process's pid and its DataLoader workers' pids, so report.py can put each case's
samples by process (the loop, a worker) and by stage.

    BENCH_VENV/bin/python bench/profile/python.py PREFIX --eod N --out FILE [--seconds S]

The cases (plan: seq_len 2048, batch 8, output i64, unshuffled, as bench/python's defaults):
  dl          dquant.torch.DataLoader, no workers: the loop takes input_ids and labels
  dl-masks    the same plan with boundaries at the EOD token, position_ids and loss_mask
  torch-w0    torch's DataLoader(batch_size=None), no workers
  torch-w1    torch's DataLoader(batch_size=None, num_workers=1): batches cross a process
  dl-w1       dquant.torch.DataLoader(num_workers=1, persistent_workers=True): its own ring
              worker, which makes each batch in Rust straight into a ring the loop reads

Why: issue 36 asks for a profile of each target still missed, and the boundary outputs' cost
and the DataLoader workers' rate are Python's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import dquant.torch as dqt
import torch


def plan(prefix: str, eod: int, masks: bool) -> dict:
    p = {"sources": [{"uri": os.path.abspath(prefix)}], "seq_len": 2048, "batch_size": 8,
         "shuffle": False, "output": "i64"}
    if masks:
        p.update(boundaries="eod", eod=eod, position_ids=True, loss_mask=True)
    return p


def loader(case: str, prefix: str, eod: int):
    ds = dqt.TokenDataset(plan(prefix, eod, case == "dl-masks"))
    if case.startswith("dl"):
        if case == "dl-w1":
            return dqt.DataLoader(ds, num_workers=1, persistent_workers=True)
        return dqt.DataLoader(ds)
    workers = int(case[-1])
    extra = dict(persistent_workers=True) if workers else {}
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, **extra)


def take(b: dict) -> int:
    """What a training step takes of a batch: its tensors, one element of each read (as
    bench/python's loop does); returns its tokens."""
    x = int(b["input_ids"][0, 0]) + int(b["labels"][0, -1])
    if "position_ids" in b:
        x += len(b["position_ids"]) + len(b["loss_mask"])
    take.sink ^= x
    return b["input_ids"].numel()


take.sink = 0


def run(case: str, prefix: str, eod: int, seconds: float) -> dict:
    """Whole passes of the case's loader for at least `seconds`."""
    dl = loader(case, prefix, eod)
    next(iter(dl))  # workers started, files open: not what is sampled
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
    tokens = 0
    own: set[int] = set()  # dquant.torch.DataLoader's workers
    while time.clock_gettime(time.CLOCK_MONOTONIC) - t0 < seconds:
        for i, b in enumerate(dl):
            tokens += take(b)
            if i == 0 and getattr(dl, "workers", None) is not None:
                own.update(dl.workers.pids())
    t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
    it = getattr(dl, "_iterator", None)
    workers = [w.pid for w in getattr(it, "_workers", []) or [] if w.pid] + sorted(own)
    del dl
    return {"case": case, "t0": t0, "t1": t1, "tokens": tokens, "workers": workers}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix")
    ap.add_argument("--eod", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cases = [run(c, a.prefix, a.eod, a.seconds) for c in ("dl", "dl-masks", "torch-w0",
                                                          "torch-w1", "dl-w1")]
    a.out.write_text(json.dumps({"pid": os.getpid(), "cases": cases}, indent=1))
    for c in cases:
        rate = c["tokens"] / (c["t1"] - c["t0"])
        print(f"{c['case']}: {rate / 1e6:,.0f} M tokens/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
