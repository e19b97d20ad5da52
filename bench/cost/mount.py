#!/usr/bin/env python3
"""The cost report's mount row: a dataset read whole through `dquant mount` (FUSE, on the
host) from a `dquant serve` on loopback, in 1 MiB reads, as a trainer's file reads would. Each
run is a fresh mount (an empty page cache for its files), so every byte comes from the agent.
Writes JSON: tokens/s, the agent's CPU per token, and the host's (the mount process and the
reader together), medians of the runs.

    bench/cost/mount.py DQUANT PREFIX --runs N --out FILE

Why here and not in bench/mount: the cost report puts every path beside the same run's
page-cache copy of the same file; bench/mount measures the mount against a local u16 copy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlib import Agent, Mount, cpu_s, read_seq, self_cpu_s  # noqa: E402


def one_run(dquant: Path, agent: Agent, at: Path, name: str) -> dict:
    m = Mount(dquant, agent.uri, at)
    try:
        mounted = at / "bench" / f"{name}.bin"
        # The first lookup (the agent opens the dataset and scans for its largest token, once
        # while it keeps the dataset open) is not a read: a mount outlives the jobs that read it.
        mounted.stat()
        return measure(m, mounted, agent.proc.pid)
    finally:
        m.stop()


def measure(m: Mount, mounted: Path, agent_pid: int) -> dict:
    """One whole read of `mounted`: its rate and the CPU it cost the agent, the mount process
    and this reader."""
    a0, m0, h0 = cpu_s(agent_pid), cpu_s(m.proc.pid), self_cpu_s()
    seconds, size = read_seq(mounted)
    agent, mount, host = cpu_s(agent_pid) - a0, cpu_s(m.proc.pid) - m0, self_cpu_s() - h0
    tokens = size // 2  # the mount shows the int32 ids as uint16 (--dtype auto)
    return {"tokens": tokens, "rate": tokens / seconds, "agent_ns": agent * 1e9 / tokens,
            "host_ns": (mount + host) * 1e9 / tokens, "mount_ns": mount * 1e9 / tokens}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dquant", type=Path)
    ap.add_argument("prefix", help="the Megatron prefix (int32 ids under 2^16)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    prefix = Path(a.prefix)
    runs = []
    with Agent(a.dquant, ["--root", f"bench={prefix.parent}"], env={"DQUANT_LOG": "warn"}) as agent, \
            tempfile.TemporaryDirectory(prefix="dquant-cost-mount-") as work:
        for run in range(a.runs):
            runs.append(one_run(a.dquant, agent, Path(work) / f"mnt-{run}", prefix.name))
            print(f"mount run {run + 1}/{a.runs}: {runs[-1]['rate'] / 1e6:,.0f} M tokens/s",
                  file=sys.stderr)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    a.out.write_text(json.dumps({"runs": runs, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
