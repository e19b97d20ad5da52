#!/usr/bin/env python3
"""The offload area's figures from one bench/offload/run.sh output directory, each against a
baseline from the same run: printed as a table, and with --record recorded as the `offload`
area (bench/results.py) with the table appended to bench/history/offload.md.

Why a script of its own: run.sh's steps write dquant-offload-bench's own JSON (throughput,
rss, ttfb); their figures used to be copied into bench/results/offload.json by hand, and
the area stayed stale from 2026-11-22 to 2026-11-28.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
from benchlib import by_case_and_cache, figure, load_json  # noqa: E402

TITLE = ("The offload agent end to end: throughput over TCP against a plain socket copy, agent "
         "memory against its limit, and time to first batch on 10 GiB against in-process")
NOTES = ("Throughput ratios are the worst of the runs against a plain TCP copy of the same bytes "
         "in the same run (range in each baseline), on zipf1g_u16 (1 Gi Zipf tokens, Megatron "
         "u16), seq_len 4095, batch 16, u16 output and wire; memory and time to first batch "
         "also use zipf10g (10 GiB int32), shuffled. The limit on the agent's memory is 64 MiB "
         "+ its prefetch budget; the memory runs' agent reads by pread (--map-budget 0), as the "
         "pages of maps it keeps are the page cache's but VmRSS counts them "
         "(bench/harness/src/rss.rs). The VM is shared: compare ratios only within a run.")


def throughput_figures(out: Path) -> list[dict]:
    """The agent over TCP against a plain TCP copy, unshuffled and shuffled: the worst run."""
    t = load_json(out, "throughput.json")
    if not t:
        return []
    figs = []
    for case, shuffle in (("agent", False), ("agent-shuffled", True)):
        ratios = [m["ratio_to_plain"] for m in t["measurements"]
                  if m["case"] == case and m.get("ratio_to_plain") is not None]
        if not ratios:
            continue
        figs.append(figure(
            f"agent over TCP, shuffle={'true' if shuffle else 'false'}, ratio to plain TCP copy "
            f"(worst of {len(ratios)} runs)", round(min(ratios), 2), "×",
            f"plain TCP copy of the same bytes over loopback, same run; ratio "
            f"{min(ratios):.2f}–{max(ratios):.2f} over {len(ratios)} runs", ">= 0.8"))
    return figs


def rss_figures(out: Path) -> list[dict]:
    """The agent's peak VmRSS streaming each dataset, against its limit."""
    figs = []
    for name, label in (("rss_u16.json", "3 passes of the 2 GiB u16 dataset, shuffled"),
                        ("rss_10g.json", "10 GiB int32 dataset, shuffled")):
        r = load_json(out, name)
        if not r:
            continue
        peak = max(r["rss_max_kib"], r["vm_hwm_kib"]) / 1024
        limit = r["limit_kib"] / 1024
        figs.append(figure(f"agent VmRSS peak, {label}", round(peak, 1), "MiB",
                        f"limit: 64 MiB + prefetch budget = {limit:.0f} MiB",
                        f"<= {limit:.0f}"))
    return figs


def ttfb_figures(out: Path) -> list[dict]:
    """Open → first batch through the agent against in-process, alternated in the same run."""
    t = load_json(out, "ttfb.json")
    if not t:
        return []
    by = by_case_and_cache(t["measurements"])
    figs = []
    for cold in (False, True):
        agent, inproc = by.get(("agent", cold)), by.get(("inproc", cold))
        if not agent or not inproc:
            continue
        a = median(m["total_s"] for m in agent) * 1000
        i = median(m["total_s"] for m in inproc) * 1000
        cache = "cold" if cold else "warm"
        base = "in-process (Offload::No), alternated in the same run"
        who = "a fresh agent" if cold else "the agent"
        figs.append(figure(f"time to first batch through {who}, 10 GiB, shuffled, {cache} "
                        f"(median of {len(agent)})", round(a, 1), "ms",
                        f"{base}: {i:.1f} ms", None))
        figs.append(figure(f"time to first batch, agent / in-process, 10 GiB, shuffled, {cache}",
                        round(a / i, 2), "×", base, None))
    return figs


def figures(out: Path) -> list[dict]:
    return throughput_figures(out) + rss_figures(out) + ttfb_figures(out)


def main() -> int:
    return benchlib.figures_main("offload", __doc__, figures, 8,
                                 ["--title", TITLE, "--notes", NOTES])


if __name__ == "__main__":
    sys.exit(main())
