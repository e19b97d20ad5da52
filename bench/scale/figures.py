#!/usr/bin/env python3
"""The scale area's figures from one bench/scale/run.sh output directory, each against a
baseline from the same run: printed as a table, and with --record recorded as the `scale`
area (bench/results.py) with the run's summary appended to bench/history/scale.md.

Why a script of its own: run.sh's steps write their tools' own JSON and text (ttfb, load,
criterion, throughput, the lab), and until now their figures were copied into
bench/results/scale.json by hand, so the area went stale for days at a time.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
from benchlib import by_case_and_cache, figure, load_json  # noqa: E402

TITLE = ("Issue 15 at the corpus's scale (97 M documents, 3.2 G int32 tokens): open and first "
         "batch, agent memory by session count, resume and schedule cost, shuffled "
         "shared-memory delivery, and the lab's auto+zstd:1 link use with the worker pool")
NOTES = ("Corpus made by the run: dquant corpus zipf --tokens 3200000000 --mean-doc-len 32 "
         "--vocab 50257 --eod 50256 (about 97 M documents, a 12.8 GB .bin and a 1.9 GB .idx); "
         "open is dquant-offload-bench ttfb --repeats 3 --cold (plan seq_len 4095, batch 16, u16 "
         "out, shuffled); memory: N consumers, each one rank of a world of N, streaming the "
         "corpus from one dquant serve (prefetch 8 frames); resume and schedule: criterion "
         "(cargo bench -p dquant-plan --bench schedule -- scale/); shuffled: "
         "dquant-offload-bench throughput --output u16, memcpy the same invocation's; the lab "
         "rows are link use of a 1 Gbit/s link (bench/lab/run.sh --no-append --size 50 "
         "--corpora r50k --compressed auto+zstd:1 --runs 1 --worker-threads W), medians of the "
         "rounds, alternating W. The VM is shared: compare ratios within one run.")

# Samples one iteration of criterion's `replay per sample` replays.
REPLAYED = 1_000_000
UNITS = {"ps": 1e-12, "ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def open_figures(out: Path) -> list[dict]:
    """Open → first batch, through the agent against in-process, cold and warm."""
    o = load_json(out, "open.json")
    if not o:
        return []
    ms = by_case_and_cache(o["measurements"])
    figs = []
    for cold, goal in ((True, 1000), (False, 50)):
        agent, inproc = ms.get(("agent", cold), []), ms.get(("inproc", cold), [])
        if not agent or not inproc:
            continue
        t = lambda xs, k: median(x[k] for x in xs) * 1000  # noqa: E731
        figs.append(figure(
            f"open → first batch through {'a fresh' if cold else 'the'} agent, "
            f"{'cold' if cold else 'warm'} page cache "
            f"(median of {len(agent)})", round(t(agent, "total_s"), 1), "ms",
            f"in-process, same run: {t(inproc, 'total_s'):.1f} ms (agent open() "
            f"{t(agent, 'open_s'):.1f} ms)", f"<= {goal}"))
    return figs


def memory_figures(out: Path) -> list[dict]:
    """The agent's peak RSS with the most sessions against one session, and its bound."""
    runs = sorted((load_json(out, p.name) for p in out.glob("memory_*.json")),
                  key=lambda m: m["consumers"])
    if len(runs) < 2:
        return []
    first, last = runs[0], runs[-1]
    peak = lambda m: m["phases"][-1]["agent"]["rss_max_kib"] / 1024  # noqa: E731
    errors = sum(m["phases"][-1]["errors"] for m in runs)
    n, pf = last["consumers"], last["per_session_bytes"]["prefetch"]
    bound = n * (pf + (2 << 20)) / 2**20
    return [figure(
        f"agent peak RSS with {n} sessions minus with {first['consumers']} session, streaming "
        "the corpus", round(peak(last) - peak(first)), "MiB",
        f"{first['consumers']} session: {peak(first):.0f} MiB peak; {n} sessions: "
        f"{peak(last):.0f} MiB peak; {errors} errors over the runs; the bound: {n} × (prefetch "
        f"{pf / 2**20:.0f} MiB + 2 MiB)", f"<= {bound:.0f}")]


CRITERION = re.compile(r"^(scale/\S.*?)\s*$\n\s*time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", re.M)


def criterion(out: Path) -> dict[str, float]:
    """Criterion's median of each `scale/` bench, in seconds."""
    p = out / "resume.txt"
    text = p.read_text() if p.exists() else ""
    return {m[1]: float(m[2]) * UNITS[m[3]] for m in CRITERION.finditer(text)}


def resume_figures(out: Path) -> list[dict]:
    """Resume at 10¹⁰ samples from a cursor with counts, and the schedule at world 4096."""
    c = criterion(out)
    figs = []
    at10 = c.get("scale/resume/with counts, 100 sources, at 10000000000")
    at9 = c.get("scale/resume/with counts, 100 sources, at 1000000000")
    # Each iteration of the replay bench replays REPLAYED samples (benches/schedule.rs).
    replay = c.get("scale/resume/replay per sample, 100 sources")
    replay = replay / REPLAYED if replay else None
    if at10 and replay:
        figs.append(figure(
            "first batch after resume with counts at 10¹⁰ samples, 100 sources",
            round(at10 * 1e6, 1), "µs",
            f"a cursor without counts replays: {replay * 1e9:.0f} ns a sample (→ "
            f"{replay * 1e10 / 60:.0f} min at 10¹⁰); at 10⁹ {at9 * 1e6:.1f} µs", "<= 50000"))
    big = c.get("scale/batch/world 4096, 1000 sources")
    small = c.get("scale/batch/world 1, 1000 sources")
    if big and small:
        figs.append(figure(
            "schedule cost per batch of 8, world 4096 × 1,000 sources",
            round(big * 1e3, 2), "ms",
            f"world 1 × 1,000 sources, same run: {small * 1e6:.1f} µs", "<= 2"))
    return figs


def shuffled_figures(out: Path) -> list[dict]:
    """Shuffled shared-memory delivery against memcpy, with no worker pool and with one."""
    figs = []
    for w in (0, 1):
        t = load_json(out, f"shuffled_w{w}.json")
        if not t:
            continue
        by = {}
        for m in t["measurements"]:
            by.setdefault(m["case"], []).append(m)
        if not {"memcpy", "agent-shm-shuffled", "agent-shm"} <= by.keys():
            continue
        gb = lambda case: median(m["gb_per_s"] for m in by[case])  # noqa: E731
        ratio = lambda case: gb(case) / gb("memcpy")  # noqa: E731
        figs.append(figure(
            f"shuffled delivery over shm, int32 narrowed to u16, --worker-threads {w}: ratio "
            "to memcpy", round(ratio("agent-shm-shuffled"), 2), "×",
            f"memcpy, same invocation: {gb('memcpy'):.1f} GB/s (shuffled "
            f"{gb('agent-shm-shuffled'):.2f} GB/s; unshuffled {gb('agent-shm'):.2f} GB/s, "
            f"{ratio('agent-shm'):.2f}×)", ">= 0.7"))
    return figs


LAB_OUT = re.compile(r"lab: results in (\S+) \(")
LAB_CASES = [("(b) agent auto+zstd:1 on r50k: link use", "lab (b) agent auto+zstd:1"),
             ("(c) chain auto+zstd:1 + shm on r50k: link use", "lab (c) chain auto+zstd:1 + shm")]


def lab_figures(out: Path) -> list[dict]:
    """Link use of the lab's compressed runs with two workers against none, medians of the
    rounds (lab_w{W}_r{K}.txt name each round's lab output)."""
    uses: dict[tuple[str, int], list[float]] = {}
    for p in sorted(out.glob("lab_w*_r*.txt")):
        w = int(re.match(r"lab_w(\d+)_r", p.name)[1])
        m = LAB_OUT.search(p.read_text())
        figs_json = Path(m[1]) / "figures.json" if m else None
        if not figs_json or not figs_json.exists():
            continue
        for f in json.loads(figs_json.read_text())["figures"]:
            for key, _ in LAB_CASES:
                if f["name"] == key:
                    uses.setdefault((key, w), []).append(f["value"])
    figs = []
    for key, label in LAB_CASES:
        two, none = uses.get((key, 2)), uses.get((key, 0))
        if not two or not none:
            continue
        rounds = lambda xs: ", ".join(f"{x:.1f}%" for x in xs)  # noqa: E731
        figs.append(figure(
            f"{label}, --worker-threads 2: link use (median of {len(two)} rounds)",
            round(median(two)), "%",
            f"--worker-threads 0, alternated: {median(none):.0f}% (rounds {rounds(none)}); W=2 "
            f"rounds {rounds(two)}", ">= 90"))
    return figs


def figures(out: Path) -> list[dict]:
    return (open_figures(out) + memory_figures(out) + resume_figures(out)
            + shuffled_figures(out) + lab_figures(out))


def summary(out: Path) -> str:
    """The run's own summary.md, for the history."""
    p = out / "summary.md"
    return p.read_text() + "\n" if p.exists() else ""


def main() -> int:
    return benchlib.figures_main("scale", __doc__, figures, 9,
                                 ["--title", TITLE, "--notes", NOTES],
                                 summary)


if __name__ == "__main__":
    sys.exit(main())
