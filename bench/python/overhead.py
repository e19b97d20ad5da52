"""Per-batch costs behind the Python loader benchmark's TokenDataset rows: where a batch's
microseconds go between dquant's reader and the training loop, each against a baseline
measured in the same run.

    bench/python/overhead.py [--prefix PREFIX] [--batches N]

Run it with the venv bench/python/run.sh made (it needs torch and the dquant package). The
default data is Megatron's r50k_int32 fixture (testkit/fixtures/megatron), read over and over
(seq_len 2047, batch 8, unshuffled, i64 output: 16,384 tokens a batch, as in bench.py).
Prints one line per measurement: microseconds per batch (best of 3 passes).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

import dquant
from dquant.torch import DataLoader, TokenDataset

REPO = Path(__file__).resolve().parents[2]


def best_us(make, passes: int = 3) -> float:
    """Best per-item time of `passes` full iterations of `make()`, in microseconds."""
    best = float("inf")
    for _ in range(passes):
        it, n = make(), 0
        t0 = time.perf_counter()
        for _ in it:
            n += 1
        best = min(best, (time.perf_counter() - t0) / max(n, 1))
    return best * 1e6


def each_us(items, f, passes: int = 3) -> float:
    """Best per-item time of calling `f` on every item, in microseconds."""
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        for x in items:
            f(x)
        best = min(best, (time.perf_counter() - t0) / len(items))
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--prefix",
        default=str(REPO / "testkit" / "fixtures" / "megatron" / "r50k_int32"),
    )
    ap.add_argument("--batches", type=int, default=3000, help="batches per pass (about)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    epochs = max(1, a.batches // 10)
    plan = {"sources": [{"uri": a.prefix}], "seq_len": 2047, "batch_size": 8,
            "shuffle": False, "epochs": epochs, "output": "i64"}
    masks = dict(plan, boundaries="eod", eod=50256, position_ids=True, loss_mask=True)

    ready = {"input_ids": torch.zeros(8, 2047, dtype=torch.int64),
             "labels": torch.zeros(8, 2047, dtype=torch.int64)}

    class Ready(torch.utils.data.IterableDataset):
        def __iter__(self):
            for _ in range(a.batches):
                yield ready

    rows = [
        ("a generator of ready dicts (baseline)", best_us(lambda: iter(Ready()))),
        ("the same through torch DataLoader(batch_size=None)",
         best_us(lambda: torch.utils.data.DataLoader(Ready(), batch_size=None))),
        ("dquant reader, numpy batches (baseline)",
         best_us(lambda: dquant.open(plan, offload=False))),
        ("TokenDataset, iterated directly", best_us(lambda: iter(TokenDataset(plan)))),
        ("TokenDataset + dquant.torch.DataLoader",
         best_us(lambda: DataLoader(TokenDataset(plan), num_workers=0))),
        ("TokenDataset + torch DataLoader(batch_size=None)",
         best_us(lambda: torch.utils.data.DataLoader(TokenDataset(plan), batch_size=None))),
        ("TokenDataset + position_ids, loss_mask + dquant.torch.DataLoader",
         best_us(lambda: DataLoader(TokenDataset(masks), num_workers=0))),
    ]
    batches = list(dquant.open(dict(masks, epochs=30), offload=False))
    rows += [
        ("Batch.masks: loss_mask and position_ids", each_us(batches, lambda b: b.base.masks(3))),
        ("numpy: np.ones f32 + np.tile(np.arange) i64 of the same shapes (baseline)",
         each_us(batches, lambda b: (np.ones((8, 2047), np.float32),
                                     np.tile(np.arange(2047), (8, 1))))),
        ("two torch.from_numpy", each_us(batches, lambda b: (torch.from_numpy(b),
                                                             torch.from_numpy(b)))),
    ]
    starts = np.mean([len(b.base.doc_starts[1]) for b in batches])
    print(f"# {a.prefix}, 8 x 2048 tokens a batch, {starts:.1f} document starts a batch")
    for name, us in rows:
        print(f"{us:8.2f} us/batch  {name}")


if __name__ == "__main__":
    main()
