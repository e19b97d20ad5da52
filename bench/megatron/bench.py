"""Megatron-order datasets: dquant's build and reads against Megatron-Core's, same run.

Figures (each a ratio against Megatron-Core measured here, or a time against its goal):
- index build: Megatron-Core's BlendedMegatronDatasetBuilder with an empty cache directory
  (what every new config costs) over dquant's build_train_valid_test_datasets;
- index build: both with an empty `path_to_cache` (both write what they built there);
- open again: both reading their indices from `path_to_cache`;
- ds[i] and get_batch(256) in this process, beside Megatron's ds[i];
- with agent= (a `dquant serve` started here on the corpora): the first open (the agent
  builds), an open the agent finds built, get_batch(256) through the shared-memory ring and
  over loopback TCP (beside the same batches made in-process), and the memory a
  rank's process grows by at 1 M, 10 M and (with --large-prefix) 100 M documents, beside the
  same in-process build's (1 M and 10 M only).

Both sides first check they give identical samples at random indices. Prints a figures file
for bench/results.py (to --figures) and a table on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

BENCH = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, BENCH)
from benchlib import Agent  # noqa: E402

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


# Run in a fresh interpreter: what a rank's process grows by when it opens the datasets and
# reads 20 batches, over what importing torch and dquant costs.
RSS_PROBE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
from dquant import megatron as dm
sys.path.insert(0, sys.argv[2])
from benchlib import status_kib
rss = lambda: status_kib("VmRSS") * 1024
cfg, sizes, agent = json.loads(sys.argv[1])
before = rss()
train = dm.build_train_valid_test_datasets(**cfg, num_samples=sizes, agent=agent)[0]
for k in range(20):
    train.get_batch(list(range(k * 997 % (len(train) - 16), k * 997 % (len(train) - 16) + 16)))
print(rss() - before)
"""


def rss_growth(cfg, sizes, agent):
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, json.dumps([cfg, sizes, agent]), BENCH],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1])


def agent_figures(binary, build, prefixes, seq_len, train_samples, rng, megatron_cold):
    """The agent= figures: opens and batches on `build` ((label, local prefix)), and a rank's
    memory at each corpus size (`prefixes`: (label, local prefix, compare in-process),
    smallest first; all in one directory)."""
    from dquant import megatron as dm

    root = os.path.dirname(build[1])
    figures = []
    # `dquant serve` over the corpora directory (root `bench`), on loopback and a Unix socket.
    with Agent(binary, ["--root", f"bench={root}"], socket=True, env={"DQUANT_LOG": "warn"}) as agent:
        sizes = [train_samples, train_samples // 100, train_samples // 1000]
        base = dict(split="969,30,1", sequence_length=seq_len, random_seed=1234, eod=50256,
                    create_attention_mask=False)
        label, prefix = build
        cfg = dict(base, blend=([f"bench/{os.path.basename(prefix)}"], None))
        train, first = timed(
            lambda: dm.build_train_valid_test_datasets(**cfg, num_samples=sizes, agent=agent.uri)[0], 1)
        local = dm.build_train_valid_test_datasets(**dict(base, blend=([prefix], None)), num_samples=sizes)[0]
        for i in (rng.randrange(len(train)) for _ in range(50)):
            dm._compare_items(f"train[{i}]", train[i], local[i])
        del local
        _, again = timed(
            lambda: dm.build_train_valid_test_datasets(**cfg, num_samples=sizes, agent=agent.uri)[0], 3)
        idx = [rng.randrange(len(train)) for _ in range(256 * 8)]
        batches = [idx[k:k + 256] for k in range(0, len(idx), 256)]
        seq = [list(range(k * 256, (k + 1) * 256)) for k in range(8)]
        shm_train = dm.build_train_valid_test_datasets(**cfg, num_samples=sizes, agent=agent.socket)[0]

        def batch_time(ds, batches):
            ds.get_batch(batches[0])
            bt = iter(batches[1:])
            return per_call(lambda: ds.get_batch(next(bt)), len(batches) - 1)

        tcp, tcp_seq = batch_time(train, batches), batch_time(train, seq)
        shm, shm_seq = batch_time(shm_train, batches), batch_time(shm_train, [
            [i + 4096 for i in b] for b in seq])
        # The same batch from the same build, without the transfer: the samples' fields made
        # in this process (what get_batch costs whatever brings the samples).
        local = dm.build_train_valid_test_datasets(**dict(base, blend=([prefix], None)), num_samples=sizes)[0]
        inproc = batch_time(local, batches)
        del local
        figures += [
            dict(name=f"index build with agent=, {label}: Megatron-Core's time ÷ the agent's first open",
                 value=round(megatron_cold / first, 2), unit="×",
                 baseline=f"Megatron-Core, empty cache: {megatron_cold:.2f} s (agent {first:.2f} s)",
                 goal=">= 10"),
            dict(name=f"open with agent=, {label}, the agent's build found (restart, other ranks)",
                 value=round(again * 1000, 1), unit="ms", baseline="Megatron-Core's cache-hit open above",
                 goal="<= 100"),
            dict(name=f"get_batch(256 × {seq_len:,}) with agent=, shared-memory ring, random indices",
                 value=round(shm * 1000, 2), unit="ms",
                 baseline=(f"in-process get_batch of the same batches: {inproc*1000:.1f} ms; "
                           f"sequential batches (prefetched): {shm_seq*1000:.1f} ms"),
                 goal="<= 2"),
            dict(name=f"get_batch(256 × {seq_len:,}) with agent=, TCP loopback, random indices",
                 value=round(tcp * 1000, 2), unit="ms",
                 baseline=(f"in-process get_batch of the same batches: {inproc*1000:.1f} ms; "
                           f"sequential batches (prefetched): {tcp_seq*1000:.1f} ms")),
        ]
        grown = []
        for label, prefix, compare in prefixes:
            c = dict(base, blend=([f"bench/{os.path.basename(prefix)}"], None))
            ours = rss_growth(c, sizes, agent.uri)
            inproc = rss_growth(dict(base, blend=([prefix], None)), sizes, None) if compare else None
            grown.append((label, ours, inproc))
        (l1, a1, _), (l2, a2, _) = grown[0], grown[-1]
        each = "; ".join(f"{l}: {a/2**20:.0f} MiB" for l, a, _ in grown)
        inproc = "; ".join(f"{l}: {i/2**20:.0f} MiB" for l, _, i in grown if i is not None)
        figures.append(dict(
            name=f"a rank's memory with agent=, growth from {l1} to {l2}",
            value=round((a2 - a1) / 2**20, 1), unit="MiB",
            baseline=f"{each}; the same build in-process: {inproc}",
            goal="<= 16"))
    return figures


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
    ap.add_argument("--small-prefix", help="a corpus of ~1 M documents, for a rank's memory with agent=")
    ap.add_argument("--large-prefix", help="a corpus of ~100 M documents, for a rank's memory with "
                    "agent= (not built in-process: that would take ~11 GB here)")
    ap.add_argument("--dquant", default="target/release/dquant", help="the binary that serves agent=")
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
    def ours_cold():
        # With an empty path_to_cache, as Megatron's: both write what they built.
        with tempfile.TemporaryDirectory() as c:
            return dm.build_train_valid_test_datasets(**cfg, num_samples=sizes, path_to_cache=c)

    _, ours_build = timed(ours_cold, a.repeat)
    with tempfile.TemporaryDirectory() as c:
        dm.build_train_valid_test_datasets(**cfg, num_samples=sizes, path_to_cache=c)
        _, ours_warm = timed(
            lambda: dm.build_train_valid_test_datasets(**cfg, num_samples=sizes, path_to_cache=c),
            a.repeat)
    cold, warm = min(theirs_cold), min(theirs_warm)
    docs = documents(a.build_prefix)
    rng = random.Random(0)
    figures = [
        dict(name=f"index build, {docs/1e6:.1f} M documents: Megatron-Core's time ÷ dquant's",
             value=round(cold / ours_build, 2), unit="×",
             baseline=f"Megatron-Core, empty cache: {cold:.2f} s (dquant {ours_build:.2f} s)", goal=">= 10"),
        dict(name=f"open again, {docs/1e6:.1f} M documents, indices read from path_to_cache",
             value=round(ours_warm * 1000, 1), unit="ms",
             baseline=f"Megatron-Core's cache-hit open: {warm*1000:.0f} ms", goal="<= 100"),
    ]
    read_docs = documents(a.read_prefix)
    figures += reads(a.read_prefix, a.seq_len, a.train_samples // 4,
                     f"{read_docs/1e3:.0f} k documents of ~1,000 tokens", rng)
    figures += reads(a.build_prefix, a.seq_len, a.train_samples // 4,
                     f"{docs/1e6:.1f} M documents of ~30 tokens", rng)
    if a.small_prefix:
        label = lambda p: f"{documents(p)/1e6:.1f} M documents"
        rss = [(label(a.small_prefix), a.small_prefix, True),
               (label(a.build_prefix), a.build_prefix, True)]
        if a.large_prefix:
            rss.append((label(a.large_prefix), a.large_prefix, False))
        figures += agent_figures(
            a.dquant, (label(a.build_prefix), a.build_prefix), rss,
            a.seq_len, a.train_samples, rng, cold)
    for f in figures:
        print(f"{f['name']:<78} {f['value']:>8} {f['unit']:<3} ({f['baseline']}" + (f"; goal {f['goal']})" if 'goal' in f else ")"))
    if a.figures:
        with open(a.figures, "w") as fh:
            json.dump({"figures": figures}, fh, indent=2, ensure_ascii=False)


if __name__ == "__main__":
    main()
