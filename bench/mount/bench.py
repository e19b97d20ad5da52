#!/usr/bin/env python3
"""`dquant mount` against local files, in the same run (issue 18).

A real `dquant serve` on loopback serves an int32 Megatron corpus; a real `dquant mount`
shows it as uint16 (`--dtype auto`). The same reads are made of the mount and of the local
uint16 copy `dquant convert` writes (the same bytes):

- sequential: the whole `.bin` in 1 MiB reads. The local file is warm in the page cache (the
  issue's baseline); the mount is read cold (a fresh mount: its page cache is empty, every
  byte comes from the agent) and then warm (its page cache);
- random: 4 KiB preads at the same random offsets, local warm against a fresh mount;
- Megatron-Core's GPTDataset: its index built and its samples iterated (each touched), over
  a fresh mount against the local copy.

The agent's files are warm for every run, so the mount's cold figure is the agent and the
mount process, not the disk. Prints a Markdown table; `--record` writes the headline figures to
bench/results/mount.json (bench/results.py: commit, date, machine; RESULTS.md rendered again)
and appends the whole table to bench/history/mount.md. `bench/mount/run.sh` runs it.
"""

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlib import Agent, Mount, cpu_s, git_commit, median, read_seq, spread, status_kib  # noqa: E402
import benchlib  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory (VmHWM) of process `pid`, MiB."""
    return status_kib("VmHWM", pid) / 1024


def drop_cache(path: Path):
    """Drops `path`'s pages from the page cache (the next read goes to the file system)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_random(path: Path, offsets: np.ndarray) -> float:
    """Seconds for one 4 KiB pread at each offset."""
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for off in offsets:
            if len(os.pread(fd, 4096, int(off))) != 4096:
                raise RuntimeError("short read")
        return time.perf_counter() - t0
    finally:
        os.close(fd)


class _Tokenizer:
    """What a GPTDatasetConfig needs from a tokenizer (vocab_size None: the .idx's dtype)."""

    def __init__(self, eod: int):
        self.eod = eod
        self.vocab_size = None
        self.unique_identifiers = {"class": "dquant-mount-bench", "eod": eod}


def gpt_dataset(prefix: Path, cache: Path, samples: int, seq_len: int) -> tuple[float, float, int]:
    """Megatron's GPTDataset over `prefix`: seconds to build its indices, seconds to iterate
    its first `samples` samples (each one summed: touched), and a checksum of them."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    shutil.rmtree(cache, ignore_errors=True)
    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=seq_len, blend=([str(prefix)], None),
        split="100,0,0", path_to_cache=str(cache), tokenizer=_Tokenizer(50256),
        mmap_bin_files=True, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False,
    )
    t0 = time.perf_counter()
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [samples, None, None], lambda: True, config).build()
    built = time.perf_counter() - t0
    check = 0
    t0 = time.perf_counter()
    for i in range(samples):
        check = (check + int(train[i]["tokens"].sum())) & 0xFFFFFFFF
    it = time.perf_counter() - t0
    del train
    return built, it, check


def command_args(argv: list) -> str:
    """The arguments a user gave run.sh: without the --dquant and --record it adds."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--dquant":
            skip = True
        elif x == "--record":
            pass
        else:
            out.append(x)
    return " ".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dquant", default=str(REPO / "target/release/dquant"))
    ap.add_argument("--corpus", help="an int32 Megatron prefix (default: the lab's r50k, else one made here)")
    ap.add_argument("--work", default="/var/tmp/dquant-mountbench")
    ap.add_argument("--mb", type=int, default=200, help="MB of text when the corpus is made here")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--random-reads", type=int, default=20000)
    ap.add_argument("--gpt-samples", type=int, default=20000)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--rss-passes", type=int, default=20, help="cold passes for the memory check (first run)")
    ap.add_argument("--record", action="store_true",
                    help="record the figures in bench/results/mount.json, the table in bench/history/mount.md")
    a = ap.parse_args()
    dquant = Path(a.dquant)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)

    corpus = Path(a.corpus) if a.corpus else None
    if corpus is None:
        lab = Path("/var/tmp/dquant-lab/size200/lab/r50k_int32")
        corpus = lab if Path(f"{lab}.bin").exists() else work / "r50k_int32"
    if not Path(f"{corpus}.bin").exists():
        print(f"bench/mount: tokenizing {a.mb} MB of text into {corpus}", file=sys.stderr)
        subprocess.run([str(dquant), "corpus", "real", "--encoding", "r50k", "--max-mb", str(a.mb), "-q", str(corpus)], check=True)
    root = work / "root"
    root.mkdir(exist_ok=True)
    for ext in ("bin", "idx"):
        link = root / f"corpus.{ext}"
        if not link.exists():
            os.link(f"{corpus}.{ext}", link) if os.stat(f"{corpus}.{ext}").st_dev == os.stat(root).st_dev else shutil.copy(f"{corpus}.{ext}", link)
    local = work / "local_u16"
    if not Path(f"{local}.bin").exists():
        subprocess.run([str(dquant), "convert", str(root / "corpus"), str(local), "--codec", "u16", "-q"], check=True)
    size = os.path.getsize(f"{local}.bin")
    tokens = size // 2
    print(f"bench/mount: {tokens:,} tokens ({size / MIB:.0f} MiB as uint16)", file=sys.stderr)

    # Warm: the agent's int32 files and the local copy.
    for p in (root / "corpus.bin", root / "corpus.idx", Path(f"{local}.bin"), Path(f"{local}.idx")):
        read_seq(p)
    rng = np.random.default_rng(7)
    offsets = rng.integers(0, (size - 4096) // 4096, a.random_reads) * 4096

    rows = {k: [] for k in ("seq_local", "seq_cold", "seq_warm", "rnd_local", "rnd_cold",
                            "gpt_local_build", "gpt_local_it", "gpt_mount_build", "gpt_mount_it",
                            "mount_cpu", "agent_cpu", "mount_rss")}
    with Agent(dquant, ["--root", f"corpus={root}"], env={"DQUANT_LOG": "warn"}) as agent:
        for run in range(a.runs):
            t, n = read_seq(Path(f"{local}.bin"))
            assert n == size
            rows["seq_local"].append(size / t)

            m = Mount(dquant, agent.uri, work / f"mnt-{run}-seq")
            mounted = m.at / "corpus" / "corpus.bin"
            # The first lookup (the agent's scan for the largest token, once while it keeps
            # the dataset open) is not a read: a mount outlives the jobs that read it.
            os.stat(mounted)
            c0, a0 = cpu_s(m.proc.pid), cpu_s(agent.proc.pid)
            t, n = read_seq(mounted)
            assert n == size, (n, size)
            rows["seq_cold"].append(size / t)
            rows["mount_cpu"].append((cpu_s(m.proc.pid) - c0) / tokens * 1e9)
            rows["agent_cpu"].append((cpu_s(agent.proc.pid) - a0) / tokens * 1e9)
            t, _ = read_seq(mounted)
            rows["seq_warm"].append(size / t)
            rows["mount_rss"].append(peak_rss_mib(m.proc.pid))
            if run == 0:
                # Memory against bytes streamed: the file again and again, its pages dropped
                # from the page cache each time, so every pass comes from the agent.
                for _ in range(a.rss_passes):
                    drop_cache(mounted)
                    read_seq(mounted)
                streamed_mib = (a.rss_passes + 2) * size / MIB
                rss_after = peak_rss_mib(m.proc.pid)
            m.stop()

            rows["rnd_local"].append(len(offsets) / read_random(Path(f"{local}.bin"), offsets))
            m = Mount(dquant, agent.uri, work / f"mnt-{run}-rnd")
            rows["rnd_cold"].append(len(offsets) / read_random(m.at / "corpus" / "corpus.bin", offsets))
            m.stop()

            b, it, want = gpt_dataset(local, work / "gpt-cache-local", a.gpt_samples, a.seq_len)
            rows["gpt_local_build"].append(b)
            rows["gpt_local_it"].append(a.gpt_samples / it)
            m = Mount(dquant, agent.uri, work / f"mnt-{run}-gpt")
            b, it, got = gpt_dataset(m.at / "corpus" / "corpus", work / "gpt-cache-mount", a.gpt_samples, a.seq_len)
            m.stop()
            if got != want:
                raise RuntimeError(f"GPTDataset over the mount gave other samples ({got} != {want})")
            rows["gpt_mount_build"].append(b)
            rows["gpt_mount_it"].append(a.gpt_samples / it)
            print(f"bench/mount: run {run + 1}/{a.runs} done", file=sys.stderr)

    def ratio(k, base):
        return [x / y for x, y in zip(rows[k], rows[base])]

    gb = lambda v: f"{v / 1e9:.2f}"
    seq_ratio = median(ratio("seq_cold", "seq_local"))
    lines = [
        "| read | local uint16 file (page cache) | through `dquant mount` | mount ÷ local |",
        "|---|---|---|---|",
        f"| sequential, 1 MiB reads: GB/s | {spread(rows['seq_local'], gb)} | cold {spread(rows['seq_cold'], gb)}; warm {spread(rows['seq_warm'], gb)} | cold {seq_ratio:.2f}×, warm {median(ratio('seq_warm', 'seq_local')):.2f}× |",
        f"| random 4 KiB preads: reads/s | {median(rows['rnd_local']):,.0f} | cold {median(rows['rnd_cold']):,.0f} | {median(ratio('rnd_cold', 'rnd_local')):.3f}× |",
        f"| Megatron GPTDataset, seq_len {a.seq_len}: index build s | {median(rows['gpt_local_build']):.3f} | {median(rows['gpt_mount_build']):.3f} | — |",
        f"| Megatron GPTDataset: samples/s iterated | {median(rows['gpt_local_it']):,.0f} | {median(rows['gpt_mount_it']):,.0f} | {median(ratio('gpt_mount_it', 'gpt_local_it')):.2f}× |",
        "",
        f"The mount process's peak RSS: {max(rows['mount_rss']):.0f} MiB after streaming the file twice ({2 * size / MIB:.0f} MiB), "
        f"{rss_after:.0f} MiB after {streamed_mib / 1024:.1f} GiB ({a.rss_passes + 2} passes, each cold: its pages dropped before it). "
        f"CPU for the cold sequential read: mount process {median(rows['mount_cpu']):.2f}, agent {median(rows['agent_cpu']):.2f} CPU-s per 10⁹ tokens (both on this machine's 2 cores). "
        f"Goal: sequential ≥ 0.5× local page-cache reads: {seq_ratio:.2f}× {'✅' if seq_ratio >= 0.5 else '❌'}. "
        f"GPTDataset's samples are identical over the mount and the local copy (checked each run).",
    ]
    table = "\n".join(lines)
    print(table)
    if a.record:
        record(a, table, tokens, {
            "seq_cold": seq_ratio,
            "seq_warm": median(ratio("seq_warm", "seq_local")),
            "seq_local_gbs": median(rows["seq_local"]) / 1e9,
            "rnd": median(ratio("rnd_cold", "rnd_local")),
            "rnd_local": median(rows["rnd_local"]),
            "gpt_it": median(ratio("gpt_mount_it", "gpt_local_it")),
            "gpt_local_it": median(rows["gpt_local_it"]),
            "gpt_build": median(rows["gpt_mount_build"]),
            "gpt_local_build": median(rows["gpt_local_build"]),
            "rss": rss_after,
            "streamed_gib": streamed_mib / 1024,
        })


def record(a, table: str, tokens: int, f: dict) -> None:
    """The figures into bench/results/mount.json (through bench/results.py, which fills in the
    commit, date and machine), and the whole table appended to bench/history/mount.md."""
    command = f"bench/mount/run.sh {command_args(sys.argv[1:])}".strip()
    figures = [
        {"name": "sequential 1 MiB reads, cold: mount ÷ local", "value": round(f["seq_cold"], 3), "unit": "×",
         "baseline": f"the local uint16 file from the page cache: {f['seq_local_gbs']:.2f} GB/s", "goal": ">= 0.5"},
        {"name": "sequential 1 MiB reads, warm: mount ÷ local", "value": round(f["seq_warm"], 3), "unit": "×",
         "baseline": f"the local file: {f['seq_local_gbs']:.2f} GB/s", "goal": None},
        {"name": "random 4 KiB preads, cold: mount ÷ local", "value": round(f["rnd"], 4), "unit": "×",
         "baseline": f"the local file: {f['rnd_local']:,.0f} reads/s", "goal": None},
        {"name": f"Megatron GPTDataset (seq_len {a.seq_len}) samples/s: mount ÷ local", "value": round(f["gpt_it"], 3),
         "unit": "×", "baseline": f"GPTDataset over the local copy: {f['gpt_local_it']:,.0f} samples/s", "goal": None},
        {"name": "GPTDataset index build through the mount", "value": round(f["gpt_build"], 3), "unit": "s",
         "baseline": f"over the local copy: {f['gpt_local_build']:.3f} s", "goal": None},
        {"name": f"mount process RSS after {f['streamed_gib']:.1f} GiB streamed", "value": round(f["rss"]), "unit": "MiB",
         "baseline": "bounded: the mount keeps no file in memory", "goal": None},
    ]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"## {when}: `dquant mount` against local files\n\n`{command}` · commit {git_commit()} · "
            f"{tokens:,} tokens of real r50k text (int32 on the agent, uint16 through the mount), "
            f"{a.runs} runs (medians; ranges where they differ).\n\n")
    if not benchlib.record("mount", figures, command, head + table + "\n\n",
                           "--title", "`dquant mount` against local files"):
        sys.exit("bench/mount/bench.py: the figures were not recorded (above: why)")

if __name__ == "__main__":
    main()
