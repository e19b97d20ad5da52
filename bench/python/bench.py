#!/usr/bin/env python3
"""End-to-end Python loader benchmark (issue 6): tokens/s delivered into a Python loop.

dquant (in-process, and through an agent over shared memory) against Megatron-Core's
GPTDataset, MosaicML Streaming (MDS) and LitData (TokensLoader), on the same tokens of one
Megatron prefix, in the same run. See README.md beside this file for what is measured and how
each peer is configured. `run.sh` sets up the environment and calls this script.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import gc
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
from benchlib import BenchError, spread  # noqa: E402

# Version of the cached data layout (MDS/LitData copies, reference checksums). Bump it when
# the way the copies are written changes, so stale caches are not reused.
CACHE_VERSION = 1
WORK_ROOT = Path(os.environ.get("DQUANT_PYBENCH_DIR", "/var/tmp/dquant-pybench"))
REPO = Path(__file__).resolve().parents[2]

# Megatron .idx dtype codes (see README.md, "Formats").
IDX_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}


log = benchlib.logger("bench")


# --------------------------------------------------------------------------------------------
# The Megatron prefix: reading, truncating, reference checksums
# --------------------------------------------------------------------------------------------


@dataclass
class Prefix:
    path: str  # prefix, without .bin/.idx
    dtype: np.dtype  # stored dtype of .bin
    seq_lengths: np.ndarray  # int32 per sequence
    doc_indices: np.ndarray  # int64, documents + 1

    @property
    def tokens(self) -> int:
        return int(self.seq_lengths.sum(dtype=np.int64))

    def memmap(self) -> np.ndarray:
        return np.memmap(self.path + ".bin", dtype=self.dtype, mode="r", shape=(self.tokens,))

    @staticmethod
    def read(path: str) -> Prefix:
        with open(path + ".idx", "rb") as f:
            head = f.read(34)
            if head[:9] != b"MMIDIDX\x00\x00":
                raise BenchError(f"{path}.idx: not a Megatron index (bad magic)")
            code = head[17]
            n_seq = int.from_bytes(head[18:26], "little")
            n_doc = int.from_bytes(head[26:34], "little")
            lengths = np.frombuffer(f.read(4 * n_seq), dtype=np.int32)
            f.seek(34 + 12 * n_seq)
            docs = np.frombuffer(f.read(8 * n_doc), dtype=np.int64)
        if code not in IDX_DTYPES:
            raise BenchError(f"{path}.idx: unknown dtype code {code}")
        dtype = np.dtype(IDX_DTYPES[code])
        p = Prefix(path, dtype, lengths, docs)
        size = os.path.getsize(path + ".bin")
        if size != p.tokens * dtype.itemsize:
            raise BenchError(
                f"{path}.bin: {size} bytes, the index says "
                f"{p.tokens} tokens of {dtype.itemsize} bytes"
            )
        return p


def truncate_prefix(src: Prefix, tokens: int, dst: str) -> Prefix:
    """Writes the first `tokens` tokens of `src` as a Megatron prefix `dst` (the last
    sequence is cut short). Cached: reused when it exists."""
    if os.path.exists(dst + ".idx") and os.path.exists(dst + ".bin"):
        p = Prefix.read(dst)
        if p.tokens == tokens:
            return p
    if tokens > src.tokens:
        raise BenchError(f"--tokens {tokens}: the corpus has only {src.tokens} tokens")
    ends = np.cumsum(src.seq_lengths, dtype=np.int64)
    keep = int(np.searchsorted(ends, tokens, side="left")) + 1  # sequences touched
    lengths = src.seq_lengths[:keep].copy()
    lengths[-1] -= int(ends[keep - 1] - tokens)
    pointers = np.zeros(keep, dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1], dtype=np.int64) * src.dtype.itemsize
    docs = src.doc_indices[src.doc_indices < keep]
    docs = np.append(docs, keep).astype(np.int64)
    code = {np.dtype(v): k for k, v in IDX_DTYPES.items()}[src.dtype]
    tmp = dst + ".tmp"
    with open(tmp + ".bin", "wb") as f:
        mm = src.memmap()
        step = 1 << 24
        for i in range(0, tokens, step):
            f.write(np.ascontiguousarray(mm[i : min(tokens, i + step)]).tobytes())
    with open(tmp + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write((1).to_bytes(8, "little"))
        f.write(bytes([code]))
        f.write(keep.to_bytes(8, "little"))
        f.write(len(docs).to_bytes(8, "little"))
        f.write(lengths.astype(np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(docs.tobytes())
    os.replace(tmp + ".bin", dst + ".bin")
    os.replace(tmp + ".idx", dst + ".idx")
    return Prefix.read(dst)


def samples_view(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """The plan's samples as a (S, seq_len+1) strided view: sample k is tokens
    [k*seq_len, k*seq_len + seq_len + 1) (Megatron GPTDataset packing, unshuffled)."""
    n = (len(tokens) - 1) // seq_len
    s = tokens.strides[0]
    return np.lib.stride_tricks.as_strided(
        tokens, shape=(n, seq_len + 1), strides=(seq_len * s, s), writeable=False
    )


def sample_multiset(rows: np.ndarray) -> int:
    """An order-free digest of `rows` (samples, one a row): the sum of their blake2b digests,
    mod 2^128. Several DataLoader workers interleave their batches (and dquant's shard the
    samples among them), so those rows are checked sample for sample, not by order."""
    total = 0
    for row in np.ascontiguousarray(rows, dtype="<i4"):
        total += int.from_bytes(hashlib.blake2b(row.data, digest_size=16).digest(), "little")
    return total % (1 << 128)


def reference(prefix: Prefix, seq_len: int) -> dict:
    v = samples_view(prefix.memmap(), seq_len)
    h = hashlib.blake2b(digest_size=16)
    total = 0
    for i in range(0, len(v), 4096):
        rows = np.ascontiguousarray(v[i : i + 4096], dtype="<i4")
        total += int(rows.sum(dtype=np.int64))
        h.update(rows.data)
    return {
        "samples": len(v),
        "tokens": len(v) * (seq_len + 1),
        "sum": total,
        "hash": h.hexdigest(),
        "max_id": int(prefix.memmap().max()),
    }


# --------------------------------------------------------------------------------------------
# Preparing the peers' copies (cached)
# --------------------------------------------------------------------------------------------


def work_dir_for(prefix: Prefix, seq_len: int) -> Path:
    st = os.stat(prefix.path + ".bin")
    with open(prefix.path + ".idx", "rb") as f:
        idx_hash = hashlib.sha256(f.read()).hexdigest()
    key = json.dumps(
        {
            "v": CACHE_VERSION,
            "bin": os.path.realpath(prefix.path + ".bin"),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "idx": idx_hash,
            "seq_len": seq_len,
        },
        sort_keys=True,
    )
    name = f"{Path(prefix.path).name}-L{seq_len}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    return WORK_ROOT / "work" / name


def prepare(prefix: Prefix, seq_len: int, wd: Path, peers: set[str], dquant_bin: str) -> dict:
    """Reference checksums, plus the MDS and LitData copies of the plan's samples (and, for the
    `dquant-local-u16copy` row, a uint16 Megatron copy made by `dquant convert`), written once
    per (input, seq_len) under `wd`."""
    wd.mkdir(parents=True, exist_ok=True)
    meta_path = wd / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if "reference" not in meta:
        t0 = time.perf_counter()
        meta["reference"] = reference(prefix, seq_len)
        log(f"reference checksums in {time.perf_counter() - t0:.1f} s")
        meta_path.write_text(json.dumps(meta, indent=1))
    ref = meta["reference"]
    if "multiset" not in ref:
        v = samples_view(prefix.memmap(), seq_len)
        ref["multiset"] = str(sum(sample_multiset(v[i : i + 4096])
                                  for i in range(0, len(v), 4096)) % (1 << 128))
        meta_path.write_text(json.dumps(meta, indent=1))
    # Peers store the narrowest numpy dtype that holds the vocabulary.
    store = "uint16" if ref["max_id"] <= 0xFFFF else "int32"
    meta["store_dtype"] = store
    v = samples_view(prefix.memmap(), seq_len)

    @contextlib.contextmanager
    def writing(key: str, what: str, out: Path):
        """Times the block, which writes `out`, into meta[key]; logs it and saves meta."""
        t0 = time.perf_counter()
        yield
        meta[key] = round(time.perf_counter() - t0, 2)
        log(f"wrote {what} in {meta[key]} s: {out}")
        meta_path.write_text(json.dumps(meta, indent=1))

    out = wd / "mds"
    if "mds" in peers and not (out / "index.json").exists():
        from streaming import MDSWriter

        with writing("mds_write_s", f"MDS copy ({len(v)} samples)", out):
            shutil.rmtree(out, ignore_errors=True)
            with MDSWriter(
                out=str(out),
                columns={"tokens": f"ndarray:{store}:{seq_len + 1}"},
                compression=None,
                progress_bar=False,
            ) as w:
                for i in range(len(v)):
                    w.write({"tokens": v[i].astype(store)})

    out = wd / "litdata"
    if "litdata" in peers and not (out / "index.json").exists():
        with writing("litdata_write_s", "LitData copy", out):
            shutil.rmtree(out, ignore_errors=True)
            write_litdata(prefix.path, seq_len, len(v), store, out)

    u16 = wd / "dquant-u16" / Path(prefix.path).name
    if "dquant-local-u16copy" in peers and not Path(str(u16) + ".idx").exists():
        if store != "uint16":
            raise BenchError("dquant-local-u16copy: the vocabulary does not fit 16 bits")
        with writing("dquant_u16_convert_s", "a uint16 copy with dquant convert", u16):
            u16.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [dquant_bin, "convert", "--quiet", prefix.path, str(u16), "--codec", "u16"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
    meta["dquant_u16_copy"] = str(u16)
    return meta


# Module-level so that litdata's worker process can pickle it.
def _litdata_samples(arg):
    import torch

    path, seq_len, start, end, store = arg
    p = Prefix.read(path)
    v = samples_view(p.memmap(), seq_len)
    for i in range(start, end):
        yield torch.from_numpy(np.ascontiguousarray(v[i], dtype=store))


def write_litdata(path: str, seq_len: int, n: int, store: str, out: Path) -> None:
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    step = 4096
    inputs = [(path, seq_len, i, min(n, i + step), store) for i in range(0, n, step)]
    # One sample (seq_len+1 tokens) per item; a chunk holds a whole number of samples (litgpt's
    # chunk of 8k blocks), so TokensLoader(block_size=seq_len+1) never straddles chunks and
    # drops nothing. One worker, files in input order: the stream order is the plan's.
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        litdata.optimize(
            fn=_litdata_samples,
            inputs=inputs,
            output_dir=str(out),
            chunk_size=(seq_len + 1) * 8192,
            item_loader=TokensLoader(),
            num_workers=1,
            reorder_files=False,
            mode="overwrite",
            start_method="fork",
            verbose=False,
        )


# --------------------------------------------------------------------------------------------
# Loaders. Each yields its native batches; the loop body (below) is the same for all.
# --------------------------------------------------------------------------------------------

# The loop body, the same for every loader (in `run_pass`): a torch tensor of the
# batch's tokens in the loader's own dtype (zero-copy `torch.from_numpy` where the loader hands
# out numpy), then `int(t.sum(dtype=torch.int64))` (reads every token once), `int(t[0, 0])`
# and `int(t[-1, -1])`.

@functools.cache
def _torch():
    import torch

    return torch


@dataclass
class Loader:
    name: str  # row label
    kind: str  # "peer", "dquant" or "ceiling"
    group: str  # "w0": all in this process; "w1": a worker process or the agent
    config: str  # how it is configured, for the table
    setup: Callable[[], None]  # untimed: build indices, datasets, agents
    batches: Callable[[], Iterable[Any]]  # a new pass (timed)
    tensor: Callable[[Any], Any]  # batch -> (tokens tensor, extra tensor or None)
    canonical: Callable[[Any], np.ndarray]  # batch -> int32 (b, seq_len+1), for the hash
    close: Callable[[], None] = lambda: None
    cpu_pids: Callable[[], list[int]] = lambda: []  # other processes doing its work
    # Rows with boundary outputs: the loop also takes them from each batch, as a training
    # step passes them on (both loaders build them whole before they yield a batch).
    outputs: Callable[[Any], float] | None = None
    setup_s: float = 0.0
    dtype: str = "?"  # dtype of the delivered token tensor
    key: str = ""  # its name in --loaders
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)


def run_pass(ld: Loader, hashing: bool) -> dict:
    """One pass over the loader, timed: creating its iterator, then for every batch the loop
    body, plus counting tokens and summing ids for the check. With `hashing` (the
    untimed verification pass) it also hashes the exact stream."""
    i64 = _torch().int64
    tensor, canonical = ld.tensor, ld.canonical
    h = hashlib.blake2b(digest_size=16) if hashing else None
    multiset = 0
    pids = ld.cpu_pids()

    def other_cpu_s() -> float:
        # Processes the pass starts and reaps itself (dquant.torch.DataLoader's workers)
        # count through the children's rusage; long-lived ones (torch's persistent workers,
        # an agent) through /proc.
        return sum(benchlib.cpu_s(p, gone=0.0) for p in pids) + benchlib.children_cpu_s()

    c_other0 = other_cpu_s()
    tokens = total = batches = 0
    first = last = first_at = None
    c0 = time.process_time()
    t0 = time.perf_counter()
    for batch in ld.batches():
        t, extra = tensor(batch)
        # The loop body (see the comment above `Loader`).
        total += int(t.sum(dtype=i64))
        f0, last = int(t[0, 0]), int(t[-1, -1])
        tokens += t.numel()
        if ld.outputs is not None:
            total += 0 * int(ld.outputs(batch))
        if extra is not None:  # Megatron's extra label token per sample
            total += int(extra.sum(dtype=i64))
            last = int(extra[-1])
            tokens += extra.numel()
        batches += 1
        if first is None:
            first_at = time.perf_counter() - t0
            first = f0
            ld.dtype = str(t.dtype).removeprefix("torch.")
        if h is not None:
            rows = np.ascontiguousarray(canonical(batch), dtype="<i4")
            h.update(rows.data)
            if ld.group not in ("w0", "w1"):
                multiset += sample_multiset(rows)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    other = other_cpu_s() - c_other0
    r = {
        "wall_s": wall,
        "cpu_s": cpu,
        "other_cpu_s": other,
        "first_batch_s": first_at,
        "first_token": first,
        "last_token": last,
        "tokens": tokens,
        "sum": total,
        "batches": batches,
    }
    if h is not None:
        r["hash"] = h.hexdigest()
        r["multiset"] = str(multiset % (1 << 128))
    return r


def warm_page_cache(paths: Iterable[Path]) -> None:
    for p in paths:
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
        for f in files:
            with open(f, "rb") as fh:
                while fh.readinto(_WARM_BUF):
                    pass


_WARM_BUF = bytearray(1 << 22)


# ---- Megatron-Core GPTDataset ---------------------------------------------------------------


class _Tokenizer:
    """The least a GPTDatasetConfig needs from a tokenizer: the end-of-document id (used only
    for masks and position ids, all disabled here). No `pad`, so Megatron uses its default -1,
    which no stored token can equal. vocab_size None: Megatron reads the .idx's dtype."""

    def __init__(self, eod: int):
        self.eod = eod
        self.vocab_size = None
        # Megatron hashes the config (tokenizer included) into its index cache's file names.
        self.unique_identifiers = {"class": "dquant-bench-tokenizer", "eod": eod}


@contextlib.contextmanager
def megatron_unshuffled():
    """GPTDataset always shuffles documents and samples (numpy RandomState). For a stream that
    can be compared token for token with the others, swap its two index builders for the same
    code without the shuffle while the indices are built: the document index is stored order
    and the shuffle index the identity. The sample index still comes from Megatron's C++
    helper, and __getitem__ still goes through all three indices, as when shuffled."""
    from megatron.core.datasets import gpt_dataset as g

    saved = g._build_document_index, g._build_shuffle_index

    def document_index(documents, num_epochs, rng, separate_final_epoch):
        idx = np.mgrid[0:num_epochs, 0 : len(documents)][1]
        idx[:] = documents
        return idx.reshape(-1).astype(np.int32)

    def shuffle_index(num_samples, total_size, rng):
        dt_ = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
        return np.arange(total_size, dtype=dt_)

    g._build_document_index, g._build_shuffle_index = document_index, shuffle_index
    try:
        yield
    finally:
        g._build_document_index, g._build_shuffle_index = saved


def megatron_loader(
    prefix: Prefix, a, ref: dict, wd: Path, workers: int, masks: bool = False
) -> Loader:
    torch = _torch()
    state: dict = {}

    def setup():
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

        cache = wd / f"megatron-cache-w{workers}{'-masks' if masks else ''}"
        shutil.rmtree(cache, ignore_errors=True)  # time the index build every run
        config = GPTDatasetConfig(
            random_seed=1234, sequence_length=a.seq_len, blend=([prefix.path], None),
            split="100,0,0", path_to_cache=str(cache), tokenizer=_Tokenizer(eod=a.eod),
            mmap_bin_files=True, reset_position_ids=masks, reset_attention_mask=False,
            eod_mask_loss=masks, create_attention_mask=False,
        )
        t0 = time.perf_counter()
        with megatron_unshuffled():
            train, _, _ = BlendedMegatronDatasetBuilder(
                GPTDataset, [ref["samples"], None, None], lambda: True, config
            ).build()
        state["index_s"] = time.perf_counter() - t0
        if len(train) != ref["samples"]:
            raise BenchError(
                f"Megatron GPTDataset has {len(train)} samples, the plan {ref['samples']}"
            )
        state["dl"] = torch.utils.data.DataLoader(
            train, batch_size=a.batch_size, shuffle=False, num_workers=workers, drop_last=False,
            **persistent(workers),
        )
        ld.notes.append(f"index build {state['index_s']:.3f} s")

    opts = ", reset_position_ids=True, eod_mask_loss=True" if masks else ""
    config = f"GPTDataset (indices built unshuffled, create_attention_mask=False{opts}) + "
    config += f"DataLoader(batch_size={a.batch_size}, num_workers={workers})"
    ld = dataloader_row(state, workers, "Megatron-Core GPTDataset", "peer", masks, config=config,
                        setup=setup, **shifted_pair("tokens"))
    return ld


def dataloader_row(
    state: dict, workers: int, name: str, kind: str, masks: bool = False, **kw
) -> Loader:
    """A row whose batches come from `state["dl"]`, the DataLoader its setup builds with
    `workers` worker processes (their CPU counts as the row's; a peer's name says so). With
    `masks`, a row of its own kind: the loop also takes each batch's position_ids and
    loss_mask."""
    return Loader(
        name=name + (" + position_ids, loss_mask" if masks else "")
        + (f" ({plural(workers, 'worker')})" if workers and kind == "peer" else ""),
        kind="masks" if masks else kind, group=f"w{workers}", batches=lambda: state["dl"],
        cpu_pids=lambda: worker_pids(state.get("dl")),
        outputs=touch_outputs if masks else None,
        **kw,
    )


def plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def persistent(workers: int) -> dict:
    """A DataLoader's keywords for `workers`: workers kept over passes (not started anew)."""
    return dict(persistent_workers=True) if workers else {}


def touch_outputs(b) -> int:
    """The loop's take of a batch's boundary outputs (their row counts: a training step hands
    the tensors on without reading them in Python)."""
    return len(b["position_ids"]) + len(b["loss_mask"])


def shifted_pair(inputs: str) -> dict:
    """`tensor` and `canonical` for batches of `{inputs: (B, L), "labels": (B, L)}` whose labels
    are the inputs shifted by one: the loop touches both, and the whole `(B, L+1)` samples are
    the inputs plus the last label."""
    torch = _torch()
    return {
        "tensor": lambda b: (b[inputs], b["labels"][:, -1]),
        "canonical": lambda b: torch.cat([b[inputs], b["labels"][:, -1:]], 1)
        .to(torch.int32)
        .numpy(),
    }


def numpy_batches() -> dict:
    """`tensor` and `canonical` for batches that are numpy arrays of whole samples."""
    torch = _torch()
    return {"tensor": lambda b: (torch.from_numpy(b), None), "canonical": lambda b: b}


def worker_pids(dl) -> list[int]:
    """The worker processes a pass of `dl` will keep alive through it: torch's persistent
    workers, or dquant.torch.DataLoader's kept ring workers (its workers started for the pass
    itself count as reaped children)."""
    own = getattr(dl, "worker_pids", None)
    if own is not None:
        return own()
    it = getattr(dl, "_iterator", None)
    return [w.pid for w in getattr(it, "_workers", []) or [] if w.pid]


# ---- MosaicML Streaming ---------------------------------------------------------------------


def mds_loader(a, wd: Path, workers: int, store: str) -> Loader:
    torch = _torch()
    state: dict = {}

    def setup():
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = StreamingDataset(
            local=str(wd / "mds"), remote=None, shuffle=False, batch_size=a.batch_size
        )
        state["ds"] = ds
        state["dl"] = torch.utils.data.DataLoader(
            ds, batch_size=a.batch_size, num_workers=workers, drop_last=False, **persistent(workers)
        )

    return dataloader_row(
        state, workers, "MosaicML Streaming", "peer",
        config=f"MDS column ndarray:{store}:{a.seq_len + 1}, StreamingDataset(local, "
        f"shuffle=False, batch_size={a.batch_size}) + DataLoader(num_workers={workers})",
        setup=setup,
        tensor=lambda b: (b["tokens"], None),
        canonical=lambda b: b["tokens"].numpy(),
    )


# ---- LitData --------------------------------------------------------------------------------


def litdata_loader(a, wd: Path, workers: int) -> Loader:
    state: dict = {}

    def setup():
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming.item_loader import TokensLoader

        ds = StreamingDataset(
            str(wd / "litdata"),
            item_loader=TokensLoader(block_size=a.seq_len + 1),
            shuffle=False,
            drop_last=False,
        )
        state["dl"] = StreamingDataLoader(
            ds, batch_size=a.batch_size, num_workers=workers, **persistent(workers)
        )

    return dataloader_row(
        state, workers, "LitData", "peer",
        config=f"optimize(TokensLoader), StreamingDataset(TokensLoader("
        f"block_size={a.seq_len + 1}), shuffle=False) + "
        f"StreamingDataLoader(batch_size={a.batch_size}, num_workers={workers})",
        setup=setup,
        tensor=lambda b: (b, None),
        canonical=lambda b: b.numpy(),
    )


# ---- the loop's own cost ----------------------------------------------------------------------


def ceiling_loader(prefix: Prefix, a, store: str) -> Loader:
    """Not a loader: the plan's batches already in memory, in a Python list. What the loop
    body alone costs; no loader can beat it in this loop."""
    state: dict = {}

    def setup():
        state["batches"] = batch_list(prefix, a, store)

    return Loader(
        name=f"(loop alone: batches already in a list, {store})", kind="ceiling", group="w0",
        config="a Python list of the plan's numpy batches, built before timing: the cost of "
        "the loop body alone, the ceiling for any loader",
        setup=setup, batches=lambda: state["batches"], **numpy_batches(),
        close=lambda: state.clear(),
    )


# The plan's batches in a list, built once for every row that takes them from one.
_BATCH_LISTS: dict = {}


def batch_list(prefix: Prefix, a, store: str) -> list:
    key = (prefix.path, a.seq_len, a.batch_size, store)
    if key not in _BATCH_LISTS:
        v = samples_view(prefix.memmap(), a.seq_len)
        _BATCH_LISTS[key] = [
            np.ascontiguousarray(v[i : i + a.batch_size], dtype=store)
            for i in range(0, len(v), a.batch_size)
        ]
    return _BATCH_LISTS[key]


def batch_numbers(n: int):
    """A torch IterableDataset of batch numbers 0 to n - 1, as ints: worker k of N yields k,
    k + N, ..., so torch's DataLoader, which takes its workers' items in turn, delivers them
    in order."""
    torch = _torch()

    class BatchNumbers(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            k, workers = (0, 1) if info is None else (info.id, info.num_workers)
            return iter(range(k, n, workers))

    return BatchNumbers()


def torch_alone_loader(prefix: Prefix, a, store: str, workers: int) -> Loader:
    """Not a loader: torch's DataLoader over a dataset whose items are batch numbers (an int
    crosses from a worker), each batch then taken from a list already in this process. What
    torch's DataLoader itself costs an item with `workers` worker processes: the ceiling for
    any dataset behind it, dquant's TokenDataset included, at this batch size."""
    torch = _torch()
    state: dict = {}

    def setup():
        state["batches"] = batch_list(prefix, a, store)
        state["dl"] = torch.utils.data.DataLoader(
            batch_numbers(len(state["batches"])), batch_size=None, num_workers=workers,
            **persistent(workers),
        )

    def batches():
        every = state["batches"]
        return (every[i] for i in state["dl"])

    return Loader(
        name=f"(torch DataLoader alone{', ' + plural(workers, 'worker') if workers else ''}: "
        f"an int a batch, the batch from a list, {store})",
        kind="ceiling", group=f"w{workers}",
        config=f"torch.utils.data.DataLoader(dataset of batch numbers, batch_size=None, "
        f"num_workers={workers}), each number's batch taken from a Python list built before "
        "timing: what torch's DataLoader itself costs a batch, the ceiling for any dataset "
        "behind it",
        setup=setup, batches=batches, cpu_pids=lambda: worker_pids(state.get("dl")),
        close=lambda: state.clear(), **numpy_batches(),
    )


# ---- dquant ---------------------------------------------------------------------------------


def dquant_plan(a, uri: str, output: str) -> dict:
    return {
        "sources": [{"uri": uri}],
        "seq_len": a.seq_len,
        "batch_size": a.batch_size,
        "shuffle": False,
        "output": output,
    }


def dquant_local(path: str, a, output: str, label: str = "") -> Loader:
    state: dict = {}

    def setup():
        import dquant

        state["dquant"] = dquant
        state["plan"] = dquant_plan(a, os.path.abspath(path), output)

    def batches():
        with contextlib.closing(state["dquant"].open(state["plan"], offload=False)) as r:
            yield from r

    return Loader(
        name=f"dquant in-process ({output}{label})", kind="dquant", group="w0",
        config=f"dquant.open(plan, offload=False), output {output}, numpy batches"
        + (f", reading {Path(path).name} (the corpus as uint16, `dquant convert --codec u16`)"
           if label else ""),
        setup=setup, batches=batches, **numpy_batches(),
    )


def dquant_shm(prefix: Prefix, a, output: str) -> Loader:
    state: dict = {}

    def setup():
        import dquant

        state["dquant"] = dquant
        # `dquant serve` on a Unix socket, serving the corpus directory as root `bench`.
        root = os.path.dirname(os.path.abspath(prefix.path))
        state["agent"] = benchlib.Agent(
            a.dquant_bin, ["--root", f"bench={root}"], socket=True, new_session=True
        )
        state["agent"].start()
        state["plan"] = dquant_plan(a, "bench/" + os.path.basename(prefix.path), output)

    def batches():
        with contextlib.closing(
            state["dquant"].open(
                state["plan"], offload=True, agent=state["agent"].socket, transport="shm"
            )
        ) as r:
            yield from r

    def close():
        if "agent" in state:
            state["agent"].close()

    return Loader(
        name=f"dquant agent, shm ({output})", kind="dquant", group="w1",
        config=f"dquant serve + dquant.open(plan, offload=True, transport='shm'), output {output}",
        setup=setup, batches=batches, **numpy_batches(), close=close,
        cpu_pids=lambda: [state["agent"].proc.pid] if "agent" in state else [],
    )


def dquant_torch(
    prefix: Prefix, a, workers: int, own_loader: bool = False, masks: bool = False
) -> Loader:
    """dquant.torch.TokenDataset as a PyTorch user would take it: int64 tensors (its default
    dtype) from a plan whose output is already i64, so nothing is converted in Python. Its
    items are dicts of `input_ids` and `labels` (seq_len each, views of one batch), through
    torch's DataLoader or dquant.torch.DataLoader (`own_loader`); with `masks`, plus
    Megatron's position_ids and loss_mask (boundaries at the EOD token)."""
    torch = _torch()
    state: dict = {}

    def setup():
        import dquant.torch as dqt

        plan = dquant_plan(a, os.path.abspath(prefix.path), "i64")
        if masks:
            plan.update(boundaries="eod", eod=a.eod, position_ids=True, loss_mask=True)
        ds = dqt.TokenDataset(plan)
        if own_loader:
            state["dl"] = dqt.DataLoader(ds, num_workers=workers, **persistent(workers))
        else:
            state["dl"] = torch.utils.data.DataLoader(
                ds, batch_size=None, num_workers=workers, **persistent(workers)
            )

    loader = "dquant.torch.DataLoader" if own_loader else "DataLoader"
    label = ", dquant DataLoader" if own_loader else ""
    name = f"dquant TokenDataset (i64{label}{', ' + plural(workers, 'worker') if workers else ''})"
    opts = ', boundaries "eod", position_ids, loss_mask' if masks else ""
    config = f"dquant.torch.TokenDataset(plan with output i64{opts}) + "
    config += f"{loader}(batch_size=None, num_workers={workers})"
    return dataloader_row(state, workers, name, "dquant", masks, config=config, setup=setup,
                          **shifted_pair("input_ids"))


def dquant_agent_dl(prefix: Prefix, a, workers: int) -> Loader:
    """dquant.torch.TokenDataset on an agent (`dquant serve` on a Unix socket, the plan over
    its shared-memory ring) through dquant.torch.DataLoader: with workers, each is a session of
    the agent's read in this process, so the agent's CPU counts as the row's."""
    state: dict = {}

    def setup():
        import dquant.torch as dqt

        root = os.path.dirname(os.path.abspath(prefix.path))
        state["agent"] = benchlib.Agent(
            a.dquant_bin, ["--root", f"bench={root}"], socket=True, new_session=True
        )
        state["agent"].start()
        plan = dquant_plan(a, "bench/" + os.path.basename(prefix.path), "i64")
        ds = dqt.TokenDataset(plan, agent=state["agent"].socket, transport="shm")
        state["dl"] = dqt.DataLoader(ds, num_workers=workers)

    def close():
        if "agent" in state:
            state["agent"].close()

    name = "dquant TokenDataset on the agent, shm (i64, dquant DataLoader"
    name += f", {plural(workers, 'worker')})" if workers else ")"
    config = ("dquant serve + dquant.torch.TokenDataset(plan with output i64, agent=SOCKET, "
              f"transport='shm') + dquant.torch.DataLoader(num_workers={workers})")
    ld = dataloader_row(state, workers, name, "dquant", config=config, setup=setup, close=close,
                        **shifted_pair("input_ids"))
    ld.cpu_pids = lambda: [state["agent"].proc.pid] if "agent" in state else []
    return ld


# --------------------------------------------------------------------------------------------
# Running and reporting
# --------------------------------------------------------------------------------------------


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.1f}" if x < 1e9 else f"{x / 1e6:,.0f}"


def machine() -> dict:
    mem = benchlib.proc_field("/proc/meminfo", "MemTotal")
    return {
        "nproc": os.cpu_count(),
        "cpu": benchlib.proc_field("/proc/cpuinfo", "model name") or "?",
        "mem": f"{int(mem.split()[0]) / 2**20:.0f} GiB" if mem else "?",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ["torch", "numpy", "megatron-core", "mosaicml-streaming", "litdata", "dquant"]:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def verify(ld: Loader, r: dict, ref: dict, exact: bool) -> None:
    want = {"tokens": ref["tokens"], "sum": ref["sum"]}
    if exact and ld.group in ("w0", "w1"):
        want["hash"] = ref["hash"]
    elif exact:  # workers interleave: the same samples, in another order
        want["multiset"] = ref["multiset"]
    got = {k: r.get(k) for k in want}
    if got != want:
        raise BenchError(
            f"{ld.name} delivered different data: got {got}, the plan has {want} "
            f"({r['batches']} batches)"
        )


# Rows whose setup may fail without failing the benchmark (reported as skipped).
OPTIONAL = {"dquant-torch", "dquant-torch-w1", "dquant-torch-dl", "dquant-torch-masks",
            "dquant-agent-dl"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    arg = ap.add_argument
    arg("--prefix", required=True, help="Megatron prefix (PREFIX.bin + PREFIX.idx)")
    arg("--mb", type=int, default=None, help="MB of text the corpus was made from (recorded only)")
    arg("--tokens", type=int, default=None,
        help="use only the first N tokens of the prefix (a truncated copy is cached)")
    arg("--seq-len", type=int, default=2048)
    arg("--batch-size", type=int, default=8)
    arg("--runs", type=int, default=3)
    arg("--torch-threads", type=int, default=1,
        help="torch intra-op threads in this process (default 1: the loop runs on one core; "
        "worker processes and the agent get the others)")
    arg("--min-run-s", type=float, default=1.0,
        help="a run repeats whole passes until it has lasted this long (default 1)")
    arg("--eod", type=int, default=50256, help="end-of-document id (Megatron config)")
    arg("--loaders",
        default="megatron,mds,litdata,dquant-local,dquant-local-i64,dquant-local-u16copy,"
        "dquant-shm,dquant-torch,dquant-torch-dl,dquant-agent-dl,megatron-masks,"
        "dquant-torch-masks,ceiling,torch-alone",
        help="comma list of: megatron, mds, litdata, dquant-local, dquant-local-i64, "
        "dquant-local-u16copy, dquant-shm, dquant-torch, dquant-torch-dl, dquant-agent-dl, "
        "megatron-masks, "
        "dquant-torch-masks, ceiling, torch-alone (default: all)")
    arg("--workers", default="",
        help="comma list of DataLoader worker counts (e.g. 1,2,4): also run LitData and "
        "dquant's TokenDataset (torch's DataLoader and dquant's) with that many workers; with "
        "1, also Megatron-Core and MosaicML Streaming")
    arg("--workers1", action="store_true", help="the same as --workers 1")
    arg("--dquant-bin", default=str(REPO / "target" / "release" / "dquant"))
    arg("--out", default=None, help="output dir (default bench/python/out/<UTC time>)")
    arg("--no-append", action="store_true",
        help="do not record (bench/results/python_loaders.json, bench/history/python_loaders.md)")
    arg("--command", default=None, help="the command line to record")
    return ap.parse_args(argv)


@dataclass
class Data:
    """The corpus the rows read, and what `prepare` made of it."""

    prefix: Prefix
    wd: Path  # the work dir: peers' copies, caches
    meta: dict  # prepare's: reference checksums, store dtype, copies' write times
    prep_s: float

    @property
    def ref(self) -> dict:
        return self.meta["reference"]

    def paths(self, key: str) -> list[Path]:
        """The files a row reads, for warming the page cache before its verification pass."""
        megatron = [Path(self.prefix.path + ".bin"), Path(self.prefix.path + ".idx")]
        u16 = self.meta["dquant_u16_copy"]
        return {
            "mds": [self.wd / "mds"],
            "litdata": [self.wd / "litdata"],
            "dquant-local-u16copy": [Path(u16 + ".bin"), Path(u16 + ".idx")],
        }.get(key.removesuffix("-w1"), megatron)


def prepare_data(a, names: list[str]) -> Data:
    """The corpus (truncated to --tokens), its reference checksums and the peers' copies."""
    prefix = Prefix.read(a.prefix)
    if a.tokens:
        dst = str(WORK_ROOT / "corpus" / f"{Path(a.prefix).name}-first{a.tokens}")
        prefix = truncate_prefix(prefix, a.tokens, dst)
    wd = work_dir_for(prefix, a.seq_len)
    log(f"data: {prefix.path} ({prefix.tokens:,} {prefix.dtype} tokens), work dir {wd}")
    t_prep = time.perf_counter()
    meta = prepare(prefix, a.seq_len, wd, set(names), a.dquant_bin)
    d = Data(prefix, wd, meta, time.perf_counter() - t_prep)
    ref = d.ref
    log(
        f"plan: {ref['samples']:,} samples of {a.seq_len + 1} tokens = {ref['tokens']:,} tokens, "
        f"batch {a.batch_size}, unshuffled; stream blake2b {ref['hash']}"
    )
    return d


def make_loaders(a, d: Data, names: list[str]) -> list[Loader]:
    """The rows --loaders names (with --workers, the N-worker twins of LitData and of
    TokenDataset), in table order: peers in one process, peers with a worker, dquant, boundary
    outputs, the loop alone."""
    prefix, ref, wd, store = d.prefix, d.ref, d.wd, d.meta["store_dtype"]
    out_dtype = "u16" if store == "uint16" else "i32"
    factories: dict[str, Callable[[], Loader]] = {
        "megatron": lambda: megatron_loader(prefix, a, ref, wd, 0),
        "mds": lambda: mds_loader(a, wd, 0, store),
        "litdata": lambda: litdata_loader(a, wd, 0),
        "ceiling": lambda: ceiling_loader(prefix, a, store),
        "torch-alone": lambda: torch_alone_loader(prefix, a, store, 0),
        "dquant-local": lambda: dquant_local(prefix.path, a, out_dtype),
        "dquant-local-i64": lambda: dquant_local(prefix.path, a, "i64"),
        "dquant-local-u16copy": lambda: dquant_local(
            d.meta["dquant_u16_copy"], a, "u16", label=", uint16 copy"
        ),
        "dquant-shm": lambda: dquant_shm(prefix, a, out_dtype),
        "dquant-torch": lambda: dquant_torch(prefix, a, 0),
        "dquant-torch-dl": lambda: dquant_torch(prefix, a, 0, own_loader=True),
        "megatron-masks": lambda: megatron_loader(prefix, a, ref, wd, 0, masks=True),
        "dquant-torch-masks": lambda: dquant_torch(prefix, a, 0, own_loader=True, masks=True),
        "dquant-agent-dl": lambda: dquant_agent_dl(prefix, a, 0),
    }
    for w in worker_counts(a):
        with_workers = {
            "litdata": lambda w=w: litdata_loader(a, wd, w),
            "dquant-torch": lambda w=w: dquant_torch(prefix, a, w),
            "dquant-torch-dl": lambda w=w: dquant_torch(prefix, a, w, own_loader=True),
            "dquant-agent-dl": lambda w=w: dquant_agent_dl(prefix, a, w),
            "torch-alone": lambda w=w: torch_alone_loader(prefix, a, store, w),
        }
        if w == 1:
            with_workers["megatron"] = lambda: megatron_loader(prefix, a, ref, wd, 1)
            with_workers["mds"] = lambda: mds_loader(a, wd, 1, store)
        factories.update({f"{n}-w{w}": f for n, f in with_workers.items()})
        names = names + [f"{n}-w{w}" for n in with_workers if n in names]
    for n in names:
        if n not in factories:
            raise BenchError(f"unknown loader {n!r}")
    loaders = []
    for n in names:
        ld = factories[n]()
        ld.key = n
        loaders.append(ld)
    loaders.sort(
        key=lambda ld: (
            {"peer": 0, "dquant": 1, "masks": 2, "ceiling": 3}[ld.kind],
            ld.group != "w0" and ld.kind == "peer",
        )
    )
    return loaders


def worker_counts(a) -> list[int]:
    """The worker counts --workers (and --workers1) ask for, in order."""
    counts = [int(w) for w in a.workers.split(",") if w.strip()]
    if a.workers1 and 1 not in counts:
        counts.insert(0, 1)
    if any(w < 1 for w in counts):
        raise BenchError(f"--workers: counts of at least 1, got {a.workers!r}")
    return sorted(set(counts))


def set_up_and_verify(loaders: list[Loader], d: Data) -> None:
    """Each row's setup (untimed; an optional or uninstalled row is skipped) and one
    verification pass: the exact stream hash. It also warms the page cache and the loader's
    lazy state."""
    for ld in loaders:
        try:
            t0 = time.perf_counter()
            ld.setup()
            ld.setup_s = time.perf_counter() - t0
        except ImportError as e:
            ld.skipped = f"not installed ({e})"
            log(f"{ld.name}: skipped, {ld.skipped}")
            continue
        except Exception as e:  # an optional row whose API is not there (yet)
            if ld.key not in OPTIONAL:
                raise
            ld.skipped = f"setup failed: {type(e).__name__}: {e}"
            log(f"{ld.name}: skipped, {ld.skipped}")
            continue
        warm_page_cache(d.paths(ld.key))
        r = run_pass(ld, hashing=True)
        verify(ld, r, d.ref, exact=True)
        log(
            f"{ld.name}: setup {ld.setup_s:.2f} s; verification pass {r['wall_s']:.2f} s "
            f"(with hashing): {r['batches']} batches, "
            + ("stream identical to the plan" if ld.group in ("w0", "w1")
               else "the plan's samples, each once (workers interleave them)")
        )


def timed_runs(a, live: list[Loader], ref: dict) -> dict[str, list[dict]]:
    """--runs timed runs of each row, round-robin over the rows so that drift in the machine's
    speed hits all. A run is one pass, or as many whole passes as take --min-run-s (fast
    rows), every one of them checked."""
    results: dict[str, list[dict]] = {ld.name: [] for ld in live}
    for run in range(a.runs):
        for ld in live:
            gc.collect()
            passes = []
            while not passes or sum(p["wall_s"] for p in passes) < a.min_run_s:
                r = run_pass(ld, hashing=False)
                verify(ld, r, ref, exact=False)
                passes.append(r)
            r = {
                k: sum(p[k] for p in passes)
                for k in ("wall_s", "cpu_s", "other_cpu_s", "tokens", "batches")
            }
            r["passes"] = len(passes)
            r["first_batch_s"] = benchlib.median(p["first_batch_s"] for p in passes)
            results[ld.name].append(r)
            log(
                f"run {run + 1}/{a.runs} {ld.name}: {r['passes']} pass(es) in "
                f"{r['wall_s']:.3f} s, {r['tokens'] / r['wall_s'] / 1e6:.1f} M tokens/s"
            )
    return results


def table_rows(loaders: list[Loader], results: dict[str, list[dict]]) -> tuple[list, dict | None]:
    """A row per loader (its runs, rates and CPU per 10⁹ tokens), each against the fastest
    peer (returned too) and, where there is one, the loop alone."""
    rows = []
    for ld in loaders:
        row = {
            "loader": ld.name, "key": ld.key,
            "goal": ld.kind == "dquant" and ld.group in ("w0", "w1") and "-w" not in ld.key,
            "kind": ld.kind, "group": ld.group, "config": ld.config, "dtype": ld.dtype,
            "setup_s": round(ld.setup_s, 3), "notes": ld.notes, "skipped": ld.skipped,
        }
        if not ld.skipped:
            rs = results[ld.name]
            rates = [r["tokens"] / r["wall_s"] for r in rs]
            row.update(
                runs=rs, rate_median=benchlib.median(rates), rates=rates,
                cpu_per_gtok=[r["cpu_s"] / r["tokens"] * 1e9 for r in rs],
                other_cpu_per_gtok=[r["other_cpu_s"] / r["tokens"] * 1e9 for r in rs],
                first_batch_s=[r["first_batch_s"] for r in rs],
            )
        rows.append(row)
    peers = [r for r in rows if r["kind"] == "peer" and not r["skipped"]]
    base = max(peers, key=lambda r: r["rate_median"]) if peers else None
    ceiling = next((r for r in rows if r["key"] == "ceiling" and not r["skipped"]), None)
    for r in rows:
        if r["skipped"]:
            continue
        r["ns_per_token"] = 1e9 / r["rate_median"]
        if ceiling:  # what the loader itself costs, the loop body's cost taken out
            r["own_ns_per_token"] = r["ns_per_token"] - 1e9 / ceiling["rate_median"]
        if base:
            r["vs_base"] = [x / base["rate_median"] for x in r["rates"]]
            r["vs_base_median"] = r["rate_median"] / base["rate_median"]
    return rows, base


def result_doc(a, d: Data, rows: list, base: dict | None, started, load_start: str) -> dict:
    """results.json: the run's setting, the data, the plan and the rows."""
    prefix, meta, ref = d.prefix, d.meta, d.ref
    return {
        "date": started.isoformat(timespec="seconds"),
        "commit": benchlib.git_commit(),
        "command": a.command or " ".join(sys.argv),
        "machine": {**machine(), "load_start": load_start},
        "versions": versions(),
        "data": {
            "prefix": prefix.path, "stored_dtype": str(prefix.dtype),
            "tokens_in_file": prefix.tokens, "documents": len(prefix.doc_indices) - 1,
            "peer_dtype": meta["store_dtype"], "work_dir": str(d.wd), "text_mb": a.mb,
            **{k: meta.get(k) for k in ("dquant_u16_convert_s", "mds_write_s", "litdata_write_s")},
        },
        "plan": {
            "seq_len": a.seq_len, "batch_size": a.batch_size, "shuffle": False,
            "samples": ref["samples"], "tokens_per_pass": ref["tokens"],
            "stream_blake2b": ref["hash"], "sum": ref["sum"],
        },
        "runs": a.runs, "min_run_s": a.min_run_s, "torch_threads": a.torch_threads,
        "baseline": base["loader"] if base else None,
        "rows": rows,
        "prepare_s": round(d.prep_s, 2),
        "elapsed_s": round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    warnings.filterwarnings("ignore")
    _torch().set_num_threads(a.torch_threads)
    logging.disable(logging.WARNING)
    started = dt.datetime.now(dt.UTC)
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = Path(a.out or REPO / "bench" / "python" / "out" / started.strftime("%Y%m%dT%H%M%SZ"))
    out.mkdir(parents=True, exist_ok=True)

    names = [x.strip() for x in a.loaders.split(",") if x.strip()]
    d = prepare_data(a, names)
    loaders = make_loaders(a, d, names)
    try:
        set_up_and_verify(loaders, d)
        results = timed_runs(a, [ld for ld in loaders if not ld.skipped], d.ref)
    finally:
        for ld in loaders:
            with contextlib.suppress(Exception):
                ld.close()

    rows, base = table_rows(loaders, results)
    res = result_doc(a, d, rows, base, started, load_start)
    table = render(res)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "table.md").write_text(table)
    print(table)
    log(f"wrote {out / 'results.json'} and {out / 'table.md'}")
    if not a.no_append:
        record(res, table)
    return 0


def render(res: dict) -> str:
    m, p, d = res["machine"], res["plan"], res["data"]
    rows = res["rows"]
    base = res["baseline"]
    lines = [
        f"- Command: `{res['command']}` (commit {res['commit']}, {res['elapsed_s']:.0f} s)",
        f"- Machine: {m['nproc']} vCPU {m['cpu']}, {m['mem']}, Linux {m['kernel']}, "
        f"Python {m['python']}; load average {m['load_start']} at the start, {m['load']} at "
        f"the end",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items() if v),
        f"- Data: `{d['prefix']}` ({d['tokens_in_file']:,} {d['stored_dtype']} tokens, "
        f"{d['documents']:,} documents); peers' copies as {d['peer_dtype']} "
        f"(written once: MDS {d['mds_write_s']} s, LitData {d['litdata_write_s']} s; "
        f"`dquant convert --codec u16` {d['dquant_u16_convert_s']} s)",
        f"- Plan: seq_len {p['seq_len']}, batch {p['batch_size']}, unshuffled, 1 epoch = "
        f"{p['samples']:,} samples of {p['seq_len'] + 1} tokens = {p['tokens_per_pass']:,} "
        f"tokens per pass; every loader's stream verified identical (blake2b "
        f"{p['stream_blake2b'][:16]}…; with 2 or more DataLoader workers, the same samples "
        f"each once, in the order the workers interleave them), and every timed pass's token "
        f"count and id sum",
        "- Loop: `for batch in loader: t = tensor(batch); int(t.sum(dtype=int64)); t[0,0]; "
        f"t[-1,-1]`; page cache warm; one Python process (DataLoader num_workers=0, torch "
        f"threads {res['torch_threads']}) unless the row says otherwise",
        f"- Baseline: {base or '—'} (the fastest peer); ranges are min–max over "
        f"{res['runs']} runs (a run: one pass, or whole passes for ≥ {res['min_run_s']} s), single "
        f"figures medians. ns/token: wall time per token (median); in brackets, minus the "
        f"'loop alone' row's: the loader's own cost",
        "",
        "| loader | delivers | M tokens/s | vs best peer | ns/token (loader's own) | "
        "Python process CPU-s / 10⁹ tok | other processes' CPU-s / 10⁹ tok | first batch ms "
        "| setup s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["skipped"]:
            lines.append(f"| {r['loader']} | skipped: {r['skipped']} | | | | | | | |")
            continue
        other = r["other_cpu_per_gtok"]
        note = f" ({'; '.join(r['notes'])})" if r["notes"] else ""
        lines.append(
            f"| {r['loader']} | {r['dtype']} | {spread(r['rates'], fmt_rate)} | "
            f"{spread(r.get('vs_base', [0]), lambda x: f'{x:.2f}×')} | "
            f"{r['ns_per_token']:.2f}"
            f"{f' ({own:.2f})' if (own := r.get('own_ns_per_token')) is not None else ''} | "
            f"{spread(r['cpu_per_gtok'], lambda x: f'{x:.1f}')} | "
            f"{spread(other, lambda x: f'{x:.1f}') if any(other) else '—'} | "
            f"{spread([x * 1e3 for x in r['first_batch_s']], lambda x: f'{x:.1f}')} | "
            f"{r['setup_s']:.2f}{note} |"
        )
    # The goal is for dquant as a trainer would use it: in this process, or with the
    # agent; its TokenDataset behind DataLoader workers is shown, not held to it.
    dq = [r for r in rows if r["kind"] == "dquant" and not r["skipped"] and r["goal"]]
    if base and dq:
        lines += ["", "| goal | target | got | |", "|---|---|---|---|"]
        for r in dq:
            ok = r["vs_base_median"] >= 3.0
            lines.append(
                f"| {r['loader']} vs best peer ({base}) | ≥ 3× | "
                f"{r['vs_base_median']:.2f}× (runs "
                f"{spread(r['vs_base'], lambda x: f'{x:.2f}')}) | "
                f"{'✅' if ok else '❌'} |"
            )
    by_key = {r["key"]: r for r in rows if not r["skipped"]}
    pairs = [
        ("dquant-torch-masks", "dquant-torch-dl", "≥ 0.80×"),
        ("megatron-masks", "megatron", None),
    ]
    if any(k in by_key and plain in by_key for k, plain, _ in pairs):
        lines += ["", "| boundary outputs | target | rate with them ÷ without | |", "|---|---|---|---|"]
        for k, plain, target in pairs:
            if k in by_key and plain in by_key:
                r, q = by_key[k], by_key[plain]
                x = r["rate_median"] / q["rate_median"]
                mark = ("✅" if x >= 0.8 else "❌") if target else "(for comparison)"
                lines.append(
                    f"| {r['loader']} vs {q['loader']} | {target or '—'} | {x:.2f}× "
                    f"(cost {1 - x:.0%} of the plain rate) | {mark} |"
                )
    workers = worker_pairs({r["key"]: r for r in rows if not r["skipped"]})
    if workers:
        lines += ["", "| DataLoader workers | target | got | |", "|---|---|---|---|"]
        for r, q, target in workers:
            x = r["rate_median"] / q["rate_median"]
            lines.append(
                f"| {r['loader']} vs {q['loader']} | ≥ {target:.1f}× | {x:.2f}× | "
                f"{'✅' if x >= target else '❌'} |"
            )
    alone = torch_ceilings({r["key"]: r for r in rows if not r["skipped"]})
    if alone:
        lines += ["", "| torch's DataLoader alone (an int a batch) | its rate ÷ TokenDataset in "
                  "this process | TokenDataset's rate ÷ it |", "|---|---|---|"]
        for r, c, own in alone:
            lines.append(
                f"| {c['loader']} | {c['rate_median'] / own['rate_median']:.2f}× | "
                f"{r['loader']}: {r['rate_median'] / c['rate_median']:.2f}× |"
            )
    lines.append("")
    lines.append("Configurations:")
    for r in rows:
        lines.append(f"- {r['loader']}: {r['config']}")
    return "\n".join(lines) + "\n"


def figures(res: dict) -> list[dict]:
    """The headline figures: each dquant row held to the issue's goal (≥ 3× the best peer),
    and what boundary outputs cost, both against rows of the same run."""
    rows = {r["key"]: r for r in res["rows"] if not r["skipped"]}
    base = next((r for r in res["rows"] if r["loader"] == res["baseline"]), None)
    out = []
    for r in rows.values():
        if r["kind"] == "dquant" and base:
            out.append({
                "name": f"{r['loader']}: tokens/s ÷ best peer's",
                "value": round(r["vs_base_median"], 3),
                "unit": "×",
                "baseline": f"{base['loader']}: {base['rate_median'] / 1e6:.1f} M tokens/s",
                "goal": ">= 3.0" if r["goal"] else None,
            })
    for r, q, target in worker_pairs(rows):
        out.append(rate_ratio(r, q, f"{r['loader']}: tokens/s ÷ {q['loader']}'s", f">= {target}"))
    for r, c, own in torch_ceilings(rows):
        out.append(rate_ratio(c, own, f"{c['loader']}: tokens/s ÷ {own['loader']}'s"))
        what = f"{r['loader']}: tokens/s ÷ torch's DataLoader alone's (an int a batch)"
        out.append(rate_ratio(r, c, what))
    if "dquant-torch-masks" in rows and "dquant-torch-dl" in rows:
        r, q = rows["dquant-torch-masks"], rows["dquant-torch-dl"]
        what = f"{r['loader']}: rate with boundary outputs ÷ without"
        out.append(rate_ratio(r, q, what, ">= 0.8"))
    return out


def rate_ratio(r: dict, q: dict, name: str, goal: str | None = None) -> dict:
    """The figure `name`: row `r`'s median rate ÷ row `q`'s, with `q` as its baseline."""
    return {
        "name": name,
        "value": round(r["rate_median"] / q["rate_median"], 3),
        "unit": "×",
        "baseline": f"{q['loader']}: {q['rate_median'] / 1e6:.1f} M tokens/s",
        "goal": goal,
    }


def worker_pairs(rows: dict) -> list[tuple[dict, dict, float]]:
    """The issue's goals for TokenDataset behind DataLoader workers, as (row, baseline row,
    target): at least 1.5x LitData with as many workers, through torch's DataLoader and
    dquant's; and never below TokenDataset in this process (torch's DataLoader, no worker)."""
    pairs = []
    for key in rows:
        if not key.startswith(("dquant-torch", "dquant-agent")) or "-w" not in key:
            continue
        if "masks" in key:
            continue
        w = key.rsplit("-w", 1)[1]
        if f"litdata-w{w}" in rows:
            pairs.append((rows[key], rows[f"litdata-w{w}"], 1.5))
        # An agent's plan with workers is held to the same plan without them (the agent is
        # the worker); TokenDataset's in-process plans to TokenDataset in this process.
        own = "dquant-agent-dl" if key.startswith("dquant-agent") else "dquant-torch"
        if own in rows:
            pairs.append((rows[key], rows[own], 1.0))
    return pairs


def torch_ceilings(rows: dict) -> list[tuple[dict, dict, dict]]:
    """TokenDataset through torch's DataLoader beside that DataLoader alone with as many
    workers, as (TokenDataset's row, the DataLoader alone, TokenDataset in this process): the
    issue holds TokenDataset with workers to its rate in this process, and no dataset behind
    torch's DataLoader can pass the DataLoader's own rate at this batch size."""
    own = rows.get("dquant-torch")
    if own is None:
        return []
    pairs = ((rows.get("dquant-torch" + key.removeprefix("torch-alone")), c)
             for key, c in rows.items() if key.startswith("torch-alone"))
    return [(r, c, own) for r, c in pairs if r is not None]


def record(res: dict, table: str) -> None:
    """The figures into bench/results/python_loaders.json (bench/results.py fills in the
    commit, date and machine, and renders RESULTS.md), and the whole write-up appended to
    bench/history/python_loaders.md (append-only)."""
    heading = (
        f"## {res['date'][:16]}: Python loaders end to end, dquant against "
        f"Megatron-Core, MosaicML Streaming and LitData\n\n"
    )
    # depends_on comes from bench/results.py's RUNS (the crates the extension and dquant reach).
    if not benchlib.record("python_loaders", figures(res), res["command"], heading + table + "\n"):
        raise BenchError("the figures were not recorded (above: why)")
    log("recorded bench/results/python_loaders.json; table in bench/history/python_loaders.md")


if __name__ == "__main__":
    benchlib.exit_on(signal.SIGTERM)  # run the finally blocks: stop the agent
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
