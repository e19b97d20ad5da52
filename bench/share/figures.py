#!/usr/bin/env python3
"""The fan-out run's figures (bench/share/run.sh's OUT/{tcp,shm,tcp-zstd}.json) in
bench/results.py's schema: per wire and transport, the 8 subscribers' agent CPU and storage
bytes against one lone reader's (goal: at most 1.2×) and their slowest reader's throughput
against the lone reader's (goal: at least 0.8×), the targets of the shared-stream issue.
Over TCP with u16 the 8 subscribers' agent CPU is also set against its floor: the lone
reader's plus 7 more bare loopback sends of its bytes (each subscriber needs one send; the
kernel's copy then costs more than making the batch, so the ratio to a lone reader alone
cannot approach 1).

    bench/share/figures.py OUT > figures.json"""

import json
import sys
from pathlib import Path

RUNS = {"tcp": "u16, TCP", "shm": "u16, shm", "tcp-zstd": "auto+zstd:3, TCP"}


def figures(out: Path) -> list[dict]:
    figs = []
    for key, label in RUNS.items():
        path = out / f"{key}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        n, lone, t = r["readers"], r["lone"], r["targets"]
        figs += [
            {"name": f"{label}, {n} subscribers: agent CPU × lone reader",
             "value": round(t["shared_cpu_vs_lone"], 3), "unit": "×",
             "baseline": f"one lone reader: {lone['agent_cpu_s']:.2f} CPU-s", "goal": "<= 1.2"},
            {"name": f"{label}, {n} subscribers: slowest reader's throughput × lone reader",
             "value": round(t["shared_slowest_rate_vs_lone"], 3), "unit": "×",
             "baseline": f"one lone reader: {lone['bytes_per_s'] / 1e6:,.0f} MB/s", "goal": ">= 0.8"},
            {"name": f"{label}, {n} separate sessions: agent CPU × lone reader",
             "value": round(r["sessions"]["agent_cpu_s"] / lone["agent_cpu_s"], 3), "unit": "×",
             "baseline": "the same lone reader (what sharing saves)", "goal": None},
        ]
        # An agent narrowing from the map it keeps with the dataset reads its tokens by no
        # syscall: rchar counts a few bytes of other reads (under 1 MB where the lone reader
        # streamed hundreds), and their ratio says nothing of the dataset's bytes.
        if t["shared_read_vs_lone"] is not None and lone["read_bytes"] >= 1e6:
            figs.append(
                {"name": f"{label}, {n} subscribers: storage bytes read × lone reader",
                 "value": round(t["shared_read_vs_lone"], 3), "unit": "×",
                 "baseline": f"one lone reader: {lone['read_bytes'] / 1e6:,.0f} MB",
                 "goal": "<= 1.2"})
        bare = r.get("bare_sends")
        if bare:
            figs += [
                {"name": f"{label}, {n} subscribers: agent CPU × lone reader plus {n - 1} bare sends",
                 "value": round(bare["shared_cpu_vs_floor"], 3), "unit": "×",
                 "baseline": f"one lone reader's {lone['agent_cpu_s']:.2f} CPU-s + {n - 1} more "
                             f"loopback sends of its bytes: {bare['shared_floor_cpu_s']:.2f} CPU-s",
                 "goal": "<= 1.2"},
                {"name": f"{label}: one bare send of the lone reader's bytes × its agent CPU",
                 "value": round(bare["one_cpu_s"] / lone["agent_cpu_s"], 3), "unit": "×",
                 "baseline": f"one lone reader: {lone['agent_cpu_s']:.2f} CPU-s", "goal": None},
            ]
        if key == "shm" and "shared_ring_readers" in r["shared"]:
            figs.append(
                {"name": f"{label}, {n} subscribers: readers of the stream's shared ring",
                 "value": r["shared"]["shared_ring_readers"], "unit": "readers",
                 "baseline": f"{n} subscribers (each one that could join it)", "goal": None})
    if not figs:
        sys.exit(f"bench/share/figures.py: no tcp.json, shm.json or tcp-zstd.json in {out}")
    return figs


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    json.dump({"figures": figures(Path(sys.argv[1]))}, sys.stdout, indent=2)
    print()
