#!/usr/bin/env python3
"""The cost report's Python rows: the cost report's plan read into a Python loop as numpy
batches with dquant's Python package, in the process (`dquant.open(plan, offload=False)`) and
from a `dquant serve` over shared memory (`transport="shm"`). The loop takes each batch as a
trainer's would (one element read, so nothing is copied again). Writes JSON: per case, tokens/s
and the CPU ns per token of the agent and of this process (the host), medians of the runs.

    PYTHON bench/cost/python.py DQUANT PREFIX --runs N --out FILE

PYTHON is a venv with numpy and the dquant package (`python/test.sh --no-tests` builds one and
prints its python). Why a script of its own: the cost report's other rows come from the Rust
harness; these are what a Python trainer pays on top of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchlib import Agent, cpu_s, self_cpu_s  # noqa: E402

import dquant  # noqa: E402

# The cost report's plan (bench/harness's defaults): seq_len 4095, batch 16, output u16.
PLAN = {"seq_len": 4095, "batch_size": 16, "shuffle": False, "output": "u16"}


def drain(reader, agent_pid: int | None) -> dict:
    """Reads `reader` to its end: tokens/s, and the agent's and this process's CPU a token."""
    a0 = cpu_s(agent_pid) if agent_pid else 0.0
    h0, t0 = self_cpu_s(), time.perf_counter()
    tokens, touched = 0, 0
    with contextlib.closing(reader) as r:
        for batch in r:
            tokens += batch.size
            touched += int(batch.flat[0])
    seconds, host = time.perf_counter() - t0, self_cpu_s() - h0
    agent = cpu_s(agent_pid) - a0 if agent_pid else None
    if tokens == 0:
        raise RuntimeError("the plan delivered no tokens")
    return {"tokens": tokens, "rate": tokens / seconds, "host_ns": host * 1e9 / tokens,
            "agent_ns": None if agent is None else agent * 1e9 / tokens}


def median_of(runs: list[dict]) -> dict:
    out = {}
    for k in runs[0]:
        xs = [r[k] for r in runs if r[k] is not None]
        out[k] = statistics.median(xs) if xs else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dquant", type=Path)
    ap.add_argument("prefix")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    prefix = os.path.abspath(a.prefix)
    local = {**PLAN, "sources": [{"uri": prefix}]}
    remote = {**PLAN, "sources": [{"uri": "bench/" + os.path.basename(prefix)}]}
    cases: dict[str, list[dict]] = {"python": [], "python-shm": []}
    with Agent(a.dquant, ["--root", f"bench={os.path.dirname(prefix)}"], socket=True,
               env={"DQUANT_LOG": "warn"}) as agent:
        for run in range(a.runs):
            cases["python"].append(drain(dquant.open(local, offload=False), None))
            r = dquant.open(remote, offload=True, agent=agent.socket, transport="shm")
            cases["python-shm"].append(drain(r, agent.proc.pid))
            print(f"python run {run + 1}/{a.runs}: in-process "
                  f"{cases['python'][-1]['rate'] / 1e6:,.0f}, shm "
                  f"{cases['python-shm'][-1]['rate'] / 1e6:,.0f} M tokens/s", file=sys.stderr)
    a.out.write_text(json.dumps({k: {"runs": v, "median": median_of(v)} for k, v in cases.items()},
                                indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
