#!/usr/bin/env python3
"""The agent's worker pool: what it costs where its threads are not needed, and what it buys
where they are. Run by bench/worker_pool/run.sh (which builds the binaries).

Three settings of the agent, alternated in every round so that a noisy machine hurts them
alike:
  w0     --worker-threads 0: no pool, each session reads on its own thread;
  w8     --worker-threads 8: the default on a host of 10 cores or more (a DPU's ARM cores),
         with the default minimum share (reads are timed; a batch is spread over the pool
         only in shares expected to take 200 µs or more);
  w8all  --worker-threads 8 --worker-min-share-us 0: every batch spread over the pool,
         however fast its reads (what the pool did before the minimum was timed).
Four measurements each (dquant-offload-bench throughput, a shared-memory session):
  warm        unshuffled, the dataset in the page cache, beside the same run's memcpy;
  warm-shuf   shuffled, the same;
  cold-shuf   shuffled, the dataset's file dropped from the page cache before the case
              (--cold): reads wait on the disk, the case the pool is for;
and, as the area recorded before, a session compressing with auto+zstd:1 over TCP with
--worker-threads 2 against 0 (its next batches compressed on the pool).

Prints a Markdown table; --record writes the figures to bench/results/worker_pool.json
(bench/results.py) and the table to bench/history/worker_pool.md. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
from benchlib import history_head, median  # noqa: E402

SETTINGS = {
    "w0": ["--worker-threads", "0"],
    "w8": ["--worker-threads", "8"],
    "w8all": ["--worker-threads", "8", "--worker-min-share-us", "0"],
}
LABEL = {
    "w0": "no pool",
    "w8": "8 workers, default minimum share",
    "w8all": "8 workers, every batch spread",
}
log = benchlib.logger("worker_pool")


def throughput(bench: str, ds: str, args: list[str]) -> list[dict]:
    """One dquant-offload-bench throughput run: its measurements."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [bench, "throughput", ds, "--runs", "1", "--json-out", out.name, *args]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise benchlib.BenchError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        return json.loads(Path(out.name).read_text())["measurements"]


def case(ms: list[dict], key: str) -> dict:
    found = [m for m in ms if m["case"] == key]
    if len(found) != 1:
        raise benchlib.BenchError(f"expected one {key} measurement, found {len(found)}")
    return found[0]


def measure(a) -> dict[str, list[dict]]:
    """rows[(kind, setting)] = one dict a round: gbps, agent CPU s/GB, ratio to memcpy."""
    rows: dict[str, list[dict]] = {}
    for rnd in range(1, a.rounds + 1):
        for s, flags in SETTINGS.items():
            ms = throughput(a.bench, a.data, ["--cases", "memcpy,agent-shm,agent-shm-shuffled",
                                              "--samples", str(a.warm_samples), *flags])
            for kind, key in [("warm", "agent-shm"), ("warm-shuf", "agent-shm-shuffled")]:
                m = case(ms, key)
                rows.setdefault(f"{kind}/{s}", []).append(
                    {"gbps": m["gb_per_s"], "cpu": m["peer_cpu_s_per_gb"], "memcpy": m["ratio_to_memcpy"]})
            m = case(throughput(a.bench, a.data, ["--cases", "agent-shm-shuffled", "--cold",
                                                  "--samples", str(a.cold_samples), *flags]),
                     "agent-shm-shuffled")
            rows.setdefault(f"cold-shuf/{s}", []).append({"gbps": m["gb_per_s"], "cpu": m["peer_cpu_s_per_gb"]})
            log(f"round {rnd}/{a.rounds} {s}: " + ", ".join(
                f"{k.split('/')[0]} {v[-1]['gbps']:.3f} GB/s {v[-1]['cpu']:.3f} s/GB"
                for k, v in rows.items() if k.endswith("/" + s)))
        for w in ["0", "2"]:
            ms = throughput(a.bench, a.data, ["--cases", "plain,agent", "--wire-codec", "auto+zstd:1",
                                              "--samples", str(a.zstd_samples), "--worker-threads", w])
            m = case(ms, "agent")
            rows.setdefault(f"zstd/w{w}", []).append({"gbps": m["gb_per_s"], "cpu": m["peer_cpu_s_per_gb"]})
        log(f"round {rnd}/{a.rounds} zstd: w0 {rows['zstd/w0'][-1]['gbps']:.3f}, w2 {rows['zstd/w2'][-1]['gbps']:.3f} GB/s")
    return rows


def med(rows, key: str, field: str) -> float:
    return median(r[field] for r in rows[key])


def per_round(rows, num: str, den: str, field: str) -> list[float]:
    """num ÷ den, round by round (the settings of one round ran back to back)."""
    return [x[field] / y[field] for x, y in zip(rows[num], rows[den])]


def table(rows) -> str:
    out = ["| measurement | setting | GB/s (u16 payload) | agent CPU s/GB | ÷ no pool: rate | ÷ no pool: CPU |",
           "|---|---|---:|---:|---:|---:|"]
    for kind, what in [("warm", "shm, unshuffled, page cache"), ("warm-shuf", "shm, shuffled, page cache"),
                       ("cold-shuf", "shm, shuffled, from the disk")]:
        for s in SETTINGS:
            k = f"{kind}/{s}"
            rate = median(per_round(rows, k, f"{kind}/w0", "gbps"))
            cpu = median(per_round(rows, k, f"{kind}/w0", "cpu"))
            out.append(f"| {what} | {LABEL[s]} | {med(rows, k, 'gbps'):.3f} | {med(rows, k, 'cpu'):.3f} | "
                       f"{rate:.2f} | {cpu:.2f} |")
    for w in ["0", "2"]:
        k = f"zstd/w{w}"
        out.append(f"| TCP, auto+zstd:1 | {w} workers | {med(rows, k, 'gbps'):.3f} | {med(rows, k, 'cpu'):.3f} | "
                   f"{median(per_round(rows, k, 'zstd/w0', 'gbps')):.2f} | {median(per_round(rows, k, 'zstd/w0', 'cpu')):.2f} |")
    return "\n".join(out)


def figures(rows) -> list[dict]:
    def ratio(kind, s, field):
        return round(median(per_round(rows, f"{kind}/{s}", f"{kind}/w0", field)), 3)

    def base(kind, s="w0"):
        k = f"{kind}/{s}"
        return f"{med(rows, k, 'gbps'):.3f} GB/s, {med(rows, k, 'cpu'):.3f} agent CPU-s/GB"

    f = []
    for kind, what in [("warm", "unshuffled"), ("warm-shuf", "shuffled")]:
        f.append({"name": f"shm, {what}, page cache: agent CPU per GB, 8 workers (default) ÷ no pool",
                  "value": ratio(kind, "w8", "cpu"), "unit": "×",
                  "baseline": f"--worker-threads 0 in the same rounds: {base(kind)}", "goal": "<= 1.1"})
        f.append({"name": f"shm, {what}, page cache: rate, 8 workers (default) ÷ no pool",
                  "value": ratio(kind, "w8", "gbps"), "unit": "×",
                  "baseline": f"--worker-threads 0 in the same rounds: {base(kind)}", "goal": ">= 0.9"})
        f.append({"name": f"shm, {what}, page cache: agent CPU per GB, 8 workers, every batch spread ÷ no pool",
                  "value": ratio(kind, "w8all", "cpu"), "unit": "×",
                  "baseline": f"--worker-min-share-us 0: {base(kind, 'w8all')}", "goal": None})
        f.append({"name": f"shm, {what}, page cache: rate, 8 workers, every batch spread ÷ no pool",
                  "value": ratio(kind, "w8all", "gbps"), "unit": "×",
                  "baseline": f"--worker-min-share-us 0: {base(kind, 'w8all')}", "goal": None})
    f.append({"name": "shm, shuffled, from the disk: rate, 8 workers (default) ÷ every batch spread",
              "value": round(median(per_round(rows, "cold-shuf/w8", "cold-shuf/w8all", "gbps")), 3), "unit": "×",
              "baseline": f"--worker-min-share-us 0 in the same rounds: {base('cold-shuf', 'w8all')}", "goal": ">= 0.9"})
    f.append({"name": "shm, shuffled, from the disk: rate, 8 workers (default) ÷ no pool",
              "value": ratio("cold-shuf", "w8", "gbps"), "unit": "×",
              "baseline": f"--worker-threads 0 in the same rounds: {base('cold-shuf')}", "goal": None})
    f.append({"name": "TCP, auto+zstd:1: rate, 2 workers ÷ no pool",
              "value": ratio("zstd", "w2", "gbps"), "unit": "×",
              "baseline": f"--worker-threads 0 in the same rounds: {base('zstd')}", "goal": None})
    f.append({"name": "TCP, auto+zstd:1: agent CPU per GB, 2 workers ÷ no pool",
              "value": ratio("zstd", "w2", "cpu"), "unit": "×",
              "baseline": f"--worker-threads 0 in the same rounds: {base('zstd')}", "goal": None})
    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="the dquant-offload-bench binary")
    ap.add_argument("--data", required=True, help="the dataset's prefix (Megatron int32)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-samples", type=int, default=400_000)
    ap.add_argument("--cold-samples", type=int, default=40_000)
    ap.add_argument("--zstd-samples", type=int, default=16_384)
    ap.add_argument("--command", default="bench/worker_pool/run.sh", help="the command recorded")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    rows = measure(a)
    t = table(rows)
    print(t)
    if not a.record:
        return
    head = history_head("the worker pool", a.command,
                        f"{Path(a.data).name}, seq_len 4095, batch 16, u16 out; {a.rounds} rounds, settings "
                        f"alternated (medians); warm {a.warm_samples:,} samples, cold {a.cold_samples:,}, "
                        f"zstd {a.zstd_samples:,}.")
    notes = ("Settings alternated within each round; ratios are taken round by round, then the median. "
             "'every batch spread' is --worker-min-share-us 0, the pool's behaviour before its minimum share "
             "was timed (it split any batch of 32 KiB or more). From the disk: the dataset's file dropped from "
             "the page cache (posix_fadvise DONTNEED) before each case.")
    if not benchlib.record("worker_pool", figures(rows), a.command, head + t + "\n\n",
                           "--title", "The agent's worker pool: its cost where reads are fast (the page cache), "
                           "its gain where they wait (the disk), and compression ahead over TCP",
                           "--notes", notes):
        sys.exit("bench/worker_pool/bench.py: the figures were not recorded (above: why)")


if __name__ == "__main__":
    try:
        main()
    except benchlib.BenchError as e:
        sys.exit(f"bench/worker_pool/bench.py: {e}")
