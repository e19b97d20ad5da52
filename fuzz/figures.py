#!/usr/bin/env python3
"""A fuzz campaign's figures, from the logs `fuzz/run.sh campaign` writes (fuzz/logs/*.log, or
any log holding its `== fuzz campaign: TARGET` headers), in bench/results.py's figure schema:
per target, its executions (goal: at least the campaign's run count) and the crashes, hangs and
out-of-memory inputs it wrote (goal: none), with libFuzzer's own final stats beside them.

    fuzz/figures.py --runs 10000000 fuzz/logs/*.log > figures.json

Only the standard library."""

from __future__ import annotations

import argparse
import json
import re
import sys

HEADER = re.compile(r"^== fuzz campaign: (\S+) \((\d+) runs\)")
STAT = re.compile(r"^stat::(\w+):\s+(\d+)")
STATUS = re.compile(r"cov: (\d+) ft: \d+ corp: (\d+)/")
DONE = re.compile(r"^Done (\d+) runs in (\d+) second")
WROTE = re.compile(r"^Test unit written to ")


def parse(paths: list[str]) -> dict[str, dict]:
    """Per target: stats, coverage, corpus, seconds and inputs written (crashes and the like)."""
    out: dict[str, dict] = {}
    cur = None
    for path in paths:
        for line in open(path, errors="replace"):
            if m := HEADER.match(line):
                cur = out.setdefault(m.group(1), {"written": 0})
                cur["runs_asked"] = int(m.group(2))
            elif cur is None:
                continue
            elif m := STAT.match(line):
                cur[m.group(1)] = int(m.group(2))
            elif m := DONE.match(line):
                cur["seconds"] = int(m.group(2))
            elif WROTE.match(line):
                cur["written"] += 1
            elif m := STATUS.search(line):
                cur["cov"], cur["corpus"] = int(m.group(1)), int(m.group(2))
    return out


def figures(stats: dict[str, dict], runs: int) -> list[dict]:
    figs = []
    for t, s in sorted(stats.items()):
        if "number_of_executed_units" not in s:
            raise SystemExit(f"fuzz/figures.py: {t}: no final stats in the log (did it finish?)")
        context = (f"{s.get('cov', 0):,} edges, corpus {s.get('corpus', 0):,} inputs, "
                   f"{s.get('average_exec_per_sec', 0):,} exec/s over {s.get('seconds', 0)} s")
        figs.append({"name": f"`{t}`: executions", "value": s["number_of_executed_units"],
                     "unit": "", "baseline": context, "goal": f">= {runs}"})
        figs.append({"name": f"`{t}`: crashes, hangs, OOMs", "value": s["written"], "unit": "",
                     "baseline": "inputs libFuzzer wrote to fuzz/artifacts", "goal": "<= 0"})
    return figs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, required=True, help="the executions each target needs")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    json.dump({"figures": figures(parse(a.logs), a.runs)}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
