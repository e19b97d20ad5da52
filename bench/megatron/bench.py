"""Megatron-order datasets: dquant's build and reads against Megatron-Core's, same run.

Figures (each a ratio against Megatron-Core measured here, or a time against its goal):
- index build: Megatron-Core's BlendedMegatronDatasetBuilder with an empty cache directory
  (what every new config costs) over dquant's build_train_valid_test_datasets;
- open: dquant's build again (it keeps no cache in-process), beside Megatron's cache-hit open;
- ds[i] and get_batch(256) in this process, beside Megatron's ds[i].

Both sides first check they give identical samples at random indices. Prints a figures file
for bench/results.py (to --figures) and a table on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
import warnings

import numpy as np
import torch

warnings.simplefilter("ignore")


def megatron_build(cfg, sizes, cache):
    """Megatron-Core's datasets for `cfg`, its index cache in `cache`."""
    from dquant import megatron as dm

    return dm.megatron_core_datasets(dm._gpt_dataset_config(path_to_cache=cache, **cfg), sizes)


def timed(f, repeat):
    out, times = None, []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return out, min(times)


def per_call(f, calls):
    t = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t) / calls


def reads(prefix, seq_len, train_samples, label, rng):
    """ds[i] and get_batch(256) on `prefix`, dquant and Megatron-Core, after checking that
    they agree at 200 random indices; the figures for one corpus."""
    from dquant import megatron as dm

    cfg = dict(blend=([prefix], None), split="969,30,1", sequence_length=seq_len,
               random_seed=1234, eod=50256, create_attention_mask=False)
    sizes = [train_samples, train_samples // 100, train_samples // 1000]
    with tempfile.TemporaryDirectory() as cache:
        theirs = megatron_build(cfg, sizes, cache)[0]
        train = dm.build_train_valid_test_datasets(**cfg, num_samples=sizes)[0]
        assert len(train) == len(theirs)
        for i in (rng.randrange(len(train)) for _ in range(200)):
            dm._compare_items(f"train[{i}]", train[i], theirs[i])
        # Warm: the same 2,000 random samples read before being timed, on both sides.
        idx = [rng.randrange(len(train)) for _ in range(2000)]
        for i in idx:
            train[i], theirs[i]
        it = iter(idx)
        ours_item = per_call(lambda: train[next(it)], len(idx))
        it = iter(idx)
        theirs_item = per_call(lambda: theirs[next(it)], len(idx))
        batches = [idx[k:k + 256] for k in range(0, 256 * 7, 256)]
        bt = iter(batches)
        ours_batch = per_call(lambda: train.get_batch(next(bt)), len(batches))
        bt = iter(batches)
        theirs_batch = per_call(
            lambda: torch.utils.data.default_collate([theirs[i] for i in next(bt)]), len(batches))
    return [
        dict(name=f"ds[i] in-process, {seq_len:,} tokens, {label}", value=round(ours_item * 1e6, 1),
             unit="µs", baseline=f"Megatron-Core's ds[i]: {theirs_item*1e6:.0f} µs", goal="<= 20"),
        dict(name=f"get_batch(256 × {seq_len:,}) in-process, {label}", value=round(ours_batch * 1000, 2),
             unit="ms", baseline=f"Megatron-Core, 256 × ds[i] + default_collate: {theirs_batch*1000:.1f} ms",
             goal="<= 2"),
    ]


def documents(prefix):
    """Sequences in the `.idx` header: the corpora here have one sequence per document."""
    return int(np.fromfile(prefix + ".idx", dtype=np.int64, count=1, offset=18)[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_prefix", help="the corpus whose index build is timed (10 M documents)")
    ap.add_argument("read_prefix", help="a corpus of typical documents for the read figures")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--train-samples", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--figures")
    a = ap.parse_args()
    from dquant import megatron as dm

    cfg = dict(blend=([a.build_prefix], None), split="969,30,1", sequence_length=a.seq_len,
               random_seed=1234, eod=50256, create_attention_mask=False)
    sizes = [a.train_samples, a.train_samples // 100, a.train_samples // 1000]
    theirs_cold, theirs_warm = [], []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory() as cache:
            _, t = timed(lambda: megatron_build(cfg, sizes, cache), 1)
            theirs_cold.append(t)
            _, t = timed(lambda: megatron_build(cfg, sizes, cache), 1)
            theirs_warm.append(t)
    ours, ours_build = timed(lambda: dm.build_train_valid_test_datasets(**cfg, num_samples=sizes), a.repeat)
    cold, warm = min(theirs_cold), min(theirs_warm)
    docs = documents(a.build_prefix)
    rng = random.Random(0)
    figures = [
        dict(name=f"index build, {docs/1e6:.1f} M documents: Megatron-Core's time ÷ dquant's",
             value=round(cold / ours_build, 2), unit="×",
             baseline=f"Megatron-Core, empty cache: {cold:.2f} s (dquant {ours_build:.2f} s)", goal=">= 10"),
        dict(name=f"open again, {docs/1e6:.1f} M documents (dquant keeps no cache in-process: a build)",
             value=round(ours_build * 1000, 1), unit="ms",
             baseline=f"Megatron-Core's cache-hit open: {warm*1000:.0f} ms", goal="<= 100"),
    ]
    read_docs = documents(a.read_prefix)
    figures += reads(a.read_prefix, a.seq_len, a.train_samples // 4,
                     f"{read_docs/1e3:.0f} k documents of ~1,000 tokens", rng)
    figures += reads(a.build_prefix, a.seq_len, a.train_samples // 4,
                     f"{docs/1e6:.1f} M documents of ~30 tokens", rng)
    for f in figures:
        print(f"{f['name']:<78} {f['value']:>8} {f['unit']:<3} ({f['baseline']}; goal {f['goal']})")
    if a.figures:
        with open(a.figures, "w") as fh:
            json.dump({"figures": figures}, fh, indent=2, ensure_ascii=False)


if __name__ == "__main__":
    main()
