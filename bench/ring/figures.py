#!/usr/bin/env python3
"""The ring area's figures from `dquant-offload-bench throughput` and `ring` JSON
(bench/ring/run.sh): every ratio within one run (against that run's memcpy, or the same run's
TCP consumer), the worst run's as the figure with the range beside it. Prints a Markdown
table; --record writes bench/results/ring.json and appends the table to
bench/history/ring.md. Standard library only."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
from benchlib import figures_table, history_head, spread  # noqa: E402


def rng(xs: list[float]) -> str:
    return spread(xs, "{:.2f}".format)


def figures(agent: list[dict], ring: list[dict]) -> list[dict]:
    def of(ms, case, **kw):
        rows = [m for m in ms if m["case"] == case and all(m.get(k) == v for k, v in kw.items())]
        if not rows:
            raise SystemExit(f"bench/ring/figures.py: no {case} {kw} measurements")
        return rows

    out = []
    for shuf, case in [("false", "agent-shm"), ("true", "agent-shm-shuffled")]:
        r = [m["ratio_to_memcpy"] for m in of(agent, case)]
        out.append({"name": f"agent over shm, shuffle={shuf}, ratio to memcpy (worst of {len(r)} runs)",
                    "value": round(min(r), 2), "unit": "×",
                    "baseline": f"memcpy, 1 thread, same run; runs {rng(r)}", "goal": ">= 0.7"})
    r = [m["consumer_cpu_ratio_to_tcp"] for m in of(agent, "agent-shm")]
    out.append({"name": f"consumer CPU per GB over shm against the TCP path, shuffle=false (worst of {len(r)} runs)",
                "value": round(max(r), 3), "unit": "×",
                "baseline": f"the consumer of the agent over TCP, same run; runs {rng(r)}", "goal": "<= 0.1"})
    r = [m["ratio_to_memcpy"] for m in of(ring, "ring-touch", crc=True)]
    out.append({"name": f"ring alone, consumer reads every byte, crc on, ratio to memcpy (worst of {len(r)} runs)",
                "value": round(min(r), 2), "unit": "×",
                "baseline": f"memcpy of a cache-hot batch, 1 thread, same run; runs {rng(r)}", "goal": ">= 0.7"})
    r = [m["ratio_to_memcpy"] for m in of(ring, "ring", crc=False)]
    out.append({"name": f"ring alone, consumer hands batches on untouched, crc off, ratio to memcpy (worst of {len(r)} runs)",
                "value": round(min(r), 2), "unit": "×",
                "baseline": f"memcpy of a cache-hot batch, 1 thread, same run; runs {rng(r)}", "goal": None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("agent_json", help="dquant-offload-bench throughput --json-out FILE")
    ap.add_argument("ring_json", help="dquant-offload-bench ring --json-out FILE")
    ap.add_argument("--command", default="bench/ring/run.sh")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    agent = json.loads(Path(a.agent_json).read_text())
    ring = json.loads(Path(a.ring_json).read_text())
    fs = figures(agent["measurements"], ring["measurements"])
    table = figures_table(fs)
    print(table)
    if not a.record:
        return
    head = history_head("the shared-memory ring", a.command,
                        f"{Path(agent['dataset']).name} ({agent['plan']}); the ring alone "
                        f"{ring['gb_per_stream']} GB a case.")
    notes = (f"Dataset {Path(agent['dataset']).name} ({agent['plan']}), warm. The agent cases are the plan on an agent "
             "process read through a shared-memory ring (agent-shm) or TCP (agent); memcpy is one thread copying the "
             "same bytes batch by batch into a ring-sized buffer. The ring alone: a producer process writes prebuilt "
             "batches (16 × 4096 u16 tokens + header) into the ring, the consumer reads every u64 word with the "
             "ring's crc32c on, or hands each batch on untouched with it off.")
    if not benchlib.record("ring", fs, a.command, head + table + "\n\n", "--notes", notes):
        sys.exit("bench/ring/figures.py: the figures were not recorded (above: why)")


if __name__ == "__main__":
    main()
