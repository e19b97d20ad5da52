#!/usr/bin/env python3
"""Batches into GPU memory: dquant's loaders on a trainer host with a GPU, against the
host-to-device copy of the same batches alone, measured in the same run.

Why: every other Python figure stops at the host loop. A trainer's batch goes one step more,
into the GPU (`pin_memory`, then a non-blocking copy), and a trainer host has the cores that
DataLoader workers need, which this project's 2-vCPU VMs do not. This runs where a CUDA
device is (`bench/gpu/run.sh` prepares what travels there; see its header) and checks that
every loader puts the plan's samples in GPU memory: a digest of each batch is computed on the
GPU from the copied tensors, in an untimed first pass of every row, and must equal the
digest of the plan's samples computed from the corpus.

Rows (tokens/s into GPU memory, best of --runs; each run repeats passes for --min-run-s):
  limit        pinned host tensors of the batches' shapes, copied as the loop copies a batch
  in-process   dquant.torch.DataLoader(num_workers=0), with and without pin_memory
  dquant DL    dquant.torch.DataLoader(num_workers=N, persistent_workers), with pin_memory=True
               and with device=DEVICE (the loader stages and copies; the loop's copy is a no-op)
  torch DL     torch.utils.data.DataLoader(TokenDataset, num_workers=N, pin_memory=True, ...)
  agent        `dquant serve` on a Unix socket, TokenDataset(agent=SOCKET, transport="shm")
               through dquant.torch.DataLoader(num_workers=N, pin_memory=True or device=DEVICE):
               N sessions
Each row also gives the CPU its processes spent per token (the loop's process, its worker
processes and the agent), from /proc.

    python3 bench/gpu/feed.py --out DIR [--tokens N] [--workers 1,2,4,8] [--dquant-bin PATH]
        [--agent-args '--worker-threads 0'] [--rows agent]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import benchlib  # noqa: E402

import dquant.torch as dqt  # noqa: E402

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for results.json and table.md")
    p.add_argument("--tokens", type=int, default=64 << 20, help="corpus tokens (int32, Zipf ids)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", default="1,2,4,8", help="worker counts of the DataLoader rows")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--min-run-s", type=float, default=1.0)
    p.add_argument("--dquant-bin", help="the dquant CLI, for the agent rows (skipped without)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--agent-args", default="",
                   help="more `dquant serve` flags for the agent rows, e.g. '--worker-threads 0'")
    p.add_argument("--rows", default="",
                   help="a regular expression: measure only the rows whose names it finds (the "
                        "limit and in-process pin_memory rows, the figures' baselines, always)")
    return p.parse_args(argv)


def make_corpus(path: Path, tokens: int) -> None:
    """A raw little-endian int32 file of Zipf-distributed ids below 50,257 (r50k's range)."""
    rng = np.random.default_rng(7)
    ids = (rng.zipf(1.2, size=tokens) - 1) % 50257
    ids.astype("<i4").tofile(path)


def children() -> list[int]:
    """This process's child processes (DataLoader workers, the agent)."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == me:
                out.append(int(d))
    return out


class Digest:
    """An order-free digest of samples, computed on the device from the copied tensors: each
    sample's tokens weighted by their position in it, summed over samples (int64, wrapping).
    Workers split a rank's samples among them, so batches differ from row to row; the samples
    do not."""

    def __init__(self, seq_len: int, device: str):
        w = torch.arange(seq_len, dtype=torch.int64, device=device) * 2654435761
        self.w = w % (1 << 31) + 1
        self.acc = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self.acc += (t * self.w).sum()

    def take(self) -> int:
        v = int(self.acc.item())
        self.acc.zero_()
        return v


def to_device(batch: dict, device: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    x = batch["input_ids"].to(device, non_blocking=True)
    y = batch["labels"].to(device, non_blocking=True)
    return x, y, x.numel()


def reference(corpus: Path, seq_len: int, w: np.ndarray) -> int:
    """The digest of every sample of the unshuffled plan, from the corpus itself: sample k is
    tokens [k L, k L + L] (inputs the first L, labels the last L)."""
    tokens = np.fromfile(corpus, dtype="<i4").astype(np.int64)
    n = (len(tokens) - 1) // seq_len
    x, y = tokens[: n * seq_len], tokens[1 : n * seq_len + 1]
    with np.errstate(over="ignore"):
        total = (x.reshape(n, seq_len) * w).sum() + (y.reshape(n, seq_len) * w).sum()
    return int(total)


class Row:
    def __init__(self, name: str, passes, close=lambda: None, pids=lambda: []):
        self.name, self.passes, self.close, self.pids = name, passes, close, pids


def timed(row: Row, a) -> dict:
    """One run: whole passes for at least --min-run-s, each ended by a device synchronize."""
    others = row.pids()

    def cpu_now() -> float:
        """CPU seconds of the loop's process, its processes still running and those it
        reaped (read before the clock starts and after it stops)."""
        running = sum(benchlib.cpu_s(pid, gone=0.0) for pid in others)
        return benchlib.self_cpu_s() + benchlib.children_cpu_s() + running

    c0 = cpu_now()
    t0 = time.perf_counter()
    tokens = passes = 0
    while True:
        for batch in row.passes():
            tokens += to_device(batch, a.device)[2]
        sync(a.device)
        passes += 1
        wall = time.perf_counter() - t0
        if wall >= a.min_run_s:
            break
    cpu = cpu_now() - c0
    return {"tokens_s": tokens / wall, "cpu_ns_token": cpu / tokens * 1e9, "passes": passes}


def checked(row: Row, a, digest: Digest, want: int | None) -> None:
    """One pass untimed (the page cache, the workers kept over passes, CUDA's first copies),
    whose samples in GPU memory must digest to `want` (None: the limit row, whose batches
    are not the corpus's)."""
    for batch in row.passes():
        x, y, _ = to_device(batch, a.device)
        digest.add(x, y)
    got = digest.take()
    if want is not None and got != want:
        raise SystemExit(f"{row.name}: its pass put other samples in GPU memory "
                         f"(digest {got}, the corpus's {want})")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def limit_row(a, batches: int) -> Row:
    """The batches' host-to-device copies alone, from pinned memory the loop already holds."""
    shape = (a.batch_size, a.seq_len)
    pinned = torch.cuda.is_available()

    def tensor():
        t = torch.randint(0, 50257, shape, dtype=torch.int64)
        return t.pin_memory() if pinned else t

    src = [{"input_ids": tensor(), "labels": tensor()} for _ in range(8)]
    return Row("limit: pinned batches copied to the GPU", lambda: (src[i % 8] for i in range(batches)))


def staged(dl, a, k: int = 3):
    """`dl`'s batches copied into `k` pinned buffers the loop reuses: what pinned memory that
    batches are made in would give. A buffer is rewritten only after the device finished the
    copies the loop issued from it (an event recorded when the loop asks for the next batch)."""
    shape = (a.batch_size, a.seq_len)
    bufs = [[torch.empty(shape, dtype=torch.int64, pin_memory=torch.cuda.is_available())
             for _ in range(2)] for _ in range(k)]
    done = [None] * k
    for i, b in enumerate(dl):
        slot = i % k
        if done[slot] is not None:
            done[slot].synchronize()
        x, y = bufs[slot]
        n = b["input_ids"].shape[0]
        x[:n].copy_(b["input_ids"])
        y[:n].copy_(b["labels"])
        yield {"input_ids": x[:n], "labels": y[:n]}
        if torch.cuda.is_available():
            done[slot] = torch.cuda.Event()
            done[slot].record()


def diagnostics(a) -> dict:
    """Microseconds per (batch, seq_len) int64 tensor: torch's pin_memory() of it, a copy into
    a pinned tensor kept, and its copy to the device from pageable and from pinned memory."""
    if not torch.cuda.is_available():
        return {}
    t = torch.randint(0, 50257, (a.batch_size, a.seq_len), dtype=torch.int64)
    kept = t.pin_memory()

    def each(f, n=300) -> float:
        for _ in range(10):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        return round((time.perf_counter() - t0) / n * 1e6, 2)

    return {
        "pin_memory_us": each(lambda: t.pin_memory()),
        "copy_into_pinned_us": each(lambda: kept.copy_(t)),
        "h2d_pageable_us": each(lambda: t.to(a.device, non_blocking=True)),
        "h2d_pinned_us": each(lambda: kept.to(a.device, non_blocking=True)),
    }


BASE_ROW = "in-process, dquant DataLoader (no workers, pin_memory)"


def dl_row(name: str, dl, close=lambda: None, pids=children) -> Row:
    return Row(name, lambda: iter(dl), close, pids)


def loader_rows(a, plan: dict, agent) -> list[Row]:
    """The rows, those of the loader's own device copy early (a run cut short keeps them)."""
    ds = dqt.TokenDataset(plan)
    plain = dqt.DataLoader(ds)
    rows = [
        dl_row("in-process, dquant DataLoader (no workers, no pin)", plain),
        dl_row(BASE_ROW, dqt.DataLoader(ds, pin_memory=True)),
        Row("in-process, dquant DataLoader (no workers), staged in 3 reused pinned buffers",
            lambda: staged(plain, a)),
        dl_row(f"in-process, dquant DataLoader (no workers, device={a.device!r})",
               dqt.DataLoader(ds, device=a.device)),
    ]
    for how in (dict(device=a.device), dict(pin_memory=True)):
        what = f"device={a.device!r}" if "device" in how else "pin_memory"
        for w in a.worker_counts:
            dl = dqt.DataLoader(dqt.TokenDataset(plan), num_workers=w, persistent_workers=True,
                                **how)
            rows.append(dl_row(f"dquant DataLoader, {w} worker(s), {what}", dl))
    if agent is not None:
        rows += agent_rows(a, plan, agent)
    for w in a.worker_counts:
        dl = torch.utils.data.DataLoader(dqt.TokenDataset(plan), batch_size=None, num_workers=w,
                                         pin_memory=True, persistent_workers=True)
        rows.append(dl_row(f"torch DataLoader + TokenDataset, {w} worker(s), pin_memory", dl))
    return rows


def agent_rows(a, plan: dict, agent) -> list[Row]:
    aplan = dict(plan, sources=[{"uri": "gpu/corpus.bin", "dtype": "int32"}])
    rows = []
    for w in [0, max(a.worker_counts, default=0)]:
        ds = dqt.TokenDataset(aplan, agent=agent.socket, transport="shm")
        dl = dqt.DataLoader(ds, num_workers=w, device=a.device)
        rows.append(dl_row(f"agent over shm, dquant DataLoader, {w} session(s), device={a.device!r}", dl))
    for w in [0, *a.worker_counts]:
        ds = dqt.TokenDataset(aplan, agent=agent.socket, transport="shm")
        dl = dqt.DataLoader(ds, num_workers=w, pin_memory=True)
        rows.append(dl_row(f"agent over shm, dquant DataLoader, {w} session(s), pin_memory", dl))
    return rows


def wanted(a, row: Row) -> bool:
    """--rows: the figures' baselines always, the other rows where the expression finds them."""
    return (not a.rows or row.name.startswith("limit") or row.name == BASE_ROW
            or re.search(a.rows, row.name) is not None)


def machine() -> dict:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu = "none (--device cpu)"
    cpu = benchlib.proc_field("/proc/cpuinfo", "model name") or platform.processor()
    return {"gpu": gpu, "cpu": cpu, "cores": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version()}


def run(a) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="dquant-gpu-feed-"))
    corpus = data / "corpus.bin"
    make_corpus(corpus, a.tokens)
    plan = {"sources": [{"uri": str(corpus), "dtype": "int32"}], "seq_len": a.seq_len,
            "batch_size": a.batch_size, "shuffle": False, "output": "i64"}
    batches = (a.tokens - 1) // a.seq_len // a.batch_size
    agent = None
    if a.dquant_bin:
        agent = benchlib.Agent(a.dquant_bin, ["--root", f"gpu={data}", *shlex.split(a.agent_args)],
                               socket=True, new_session=True).start()
    digest = Digest(a.seq_len, a.device)
    rows = [r for r in [limit_row(a, batches), *loader_rows(a, plan, agent)] if wanted(a, r)]
    want = reference(corpus, a.seq_len, digest.w.cpu().numpy())
    doc = {"machine": machine(), "diagnostics": diagnostics(a),
           "args": {k: v for k, v in vars(a).items() if k != "worker_counts"}, "rows": []}
    try:
        for row in rows:
            checked(row, a, digest, None if row.name.startswith("limit") else want)
            runs = [timed(row, a) for _ in range(a.runs)]
            best = max(runs, key=lambda r: r["tokens_s"])
            doc["rows"].append({"row": row.name, **best, "runs": [r["tokens_s"] for r in runs]})
            # Written after every row: a run cut short keeps what it measured.
            (out / "results.json").write_text(json.dumps(doc, indent=1))
            print(f"{row.name:70s} {best['tokens_s'] / 1e6:9.1f} M tokens/s "
                  f"{best['cpu_ns_token']:6.2f} CPU ns/token", flush=True)
            row.close()
    finally:
        if agent is not None:
            agent.close()
        shutil.rmtree(data, ignore_errors=True)
    return doc


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.worker_counts = [int(w) for w in a.workers.split(",") if w]
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run this where one is (bench/gpu/run.sh)")
    run(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
