#!/usr/bin/env python3
"""The hostile_load area's figures from one `dquant-offload-bench load` JSON
(bench/load/run.sh): the hostile phase against the baseline phase of the same run, and the
agent's memory and threads against the bounds the harness computed for the sessions it had
at its peak. Prints a Markdown table; --record writes bench/results/hostile_load.json and
appends the table to bench/history/hostile_load.md. Standard library only."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
from benchlib import figures_table, history_head  # noqa: E402

MIB = 1024.0


def phases(doc: dict) -> tuple[dict, dict]:
    by = {("hostile" if p.get("hostile") else "baseline"): p for p in doc["phases"]}
    if set(by) != {"baseline", "hostile"}:
        raise SystemExit(f"bench/load/figures.py: expected a baseline and a hostile phase, got {sorted(by)}")
    return by["baseline"], by["hostile"]


def figures(doc: dict) -> list[dict]:
    base, hos = phases(doc)
    n = doc["consumers"]
    ba, ha = base["agent"], hos["agent"]
    gap = lambda p: max(p["per_consumer_max_gap_ms"])  # noqa: E731
    med_gap = lambda p: statistics.median(p["per_consumer_max_gap_ms"])  # noqa: E731
    at_peak = ha["streaming_peak"] + ha["pending_peak"]
    return [
        {"name": f"errors seen by the {n} well-behaved consumers, hostile phase", "value": hos["errors"],
         "unit": "errors",
         "baseline": f"baseline phase (the consumers alone): {base['errors']}; "
                     f"{hos['batches_verified'] - hos['batches_mismatched']} of {hos['batches_verified']} checked "
                     f"batches equal to the in-process stream (baseline {base['batches_verified'] - base['batches_mismatched']} "
                     f"of {base['batches_verified']})",
         "goal": "<= 0"},
        {"name": f"Jain's fairness index over the {n} consumers' payload bytes, hostile phase",
         "value": round(hos["jain"], 4), "unit": "index", "baseline": f"baseline phase: {base['jain']:.4f}",
         "goal": ">= 0.95"},
        {"name": "payload throughput, all consumers, hostile / baseline",
         "value": round(hos["gb_per_s"] / base["gb_per_s"], 3), "unit": "×",
         "baseline": f"baseline phase: {base['gb_per_s']:.3f} GB/s (hostile {hos['gb_per_s']:.3f} GB/s)", "goal": None},
        {"name": "longest wait for one batch (worst consumer), hostile / baseline",
         "value": round(gap(hos) / gap(base), 2), "unit": "×",
         "baseline": f"baseline phase: {gap(base):.0f} ms (hostile {gap(hos):.0f} ms; medians over consumers "
                     f"{med_gap(base):.0f} → {med_gap(hos):.0f} ms)", "goal": None},
        {"name": "agent VmHWM (peak), hostile phase", "value": round(ha["vm_hwm_kib"] / MIB, 1), "unit": "MiB",
         "baseline": f"memory bound for the {ha['streaming_peak']} streaming + {ha['pending_peak']} pending sessions "
                     f"at the peak: {ha['rss_bound_kib'] / MIB:.1f} MiB (VmHWM / bound "
                     f"{ha['vm_hwm_kib'] / ha['rss_bound_kib']:.3f}); baseline phase VmHWM {ba['vm_hwm_kib'] / MIB:.1f} MiB",
         "goal": f"<= {ha['rss_bound_kib'] / MIB:.1f}"},
        {"name": "agent VmHWM / bound without the index (frame pool + batch only), hostile phase",
         "value": round(ha["vm_hwm_kib"] / ha["rss_bound_without_index_kib"], 3), "unit": "×",
         "baseline": f"baseline phase: {ba['vm_hwm_kib'] / ba['rss_bound_without_index_kib']:.3f}", "goal": None},
        {"name": "agent threads, most at once, hostile phase", "value": ha["threads_max"], "unit": "threads",
         "baseline": f"thread bound for the {at_peak} sessions at the peak: {ha['threads_bound']}; "
                     f"baseline phase {ba['threads_max']}",
         "goal": f"<= {ha['threads_bound']}"},
        {"name": "agent threads after the clients left, hostile phase", "value": ha["end_threads"], "unit": "threads",
         "baseline": f"{ha['idle_threads']} idle before the run", "goal": None},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="dquant-offload-bench load --json-out FILE")
    ap.add_argument("--command", default="bench/load/run.sh")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    doc = json.loads(Path(a.json).read_text())
    fs = figures(doc)
    table = figures_table(fs)
    print(table)
    if not a.record:
        return
    _, hos = phases(doc)
    h = hos["hostile"]
    head = history_head("the agent under load", a.command,
                        f"{Path(doc['dataset']).name} ({doc['plan']}), {doc['consumers']} consumers, "
                        f"{doc['duration_s']:.0f} s a phase.")
    notes = (f"Each phase on a fresh dquant serve (loopback; the config is the harness's, prefetch "
             f"{doc['prefetch_frames']} frames), the {doc['consumers']} consumers each one rank of a world of "
             f"{doc['world']}, {doc['duration_s']:.0f} s measured after every consumer had its first batch. "
             f"Hostile clients in that phase: {h['killed_mid_stream']} killed mid-stream "
             f"({h['killed_before_first_batch']} before their first batch), {h['stalled']} stalled, "
             f"{h['garbage_connections']} garbage connections to both ports. The bounds are the harness's, for the "
             f"sessions the agent had at its peak (its own metrics).")
    if not benchlib.record("hostile_load", fs, a.command, head + table + "\n\n",
                           "--notes", notes):
        sys.exit("bench/load/figures.py: the figures were not recorded (above: why)")


if __name__ == "__main__":
    main()
