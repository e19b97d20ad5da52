#!/usr/bin/env python3
"""Resume at 10^10 samples, timed through the release CLI in-process and through an agent
(see run.sh), and the area's figures with criterion's estimates of the same run.

    measure.py OUT --dquant BIN --runs N --fixtures DIR   time each resume, write OUT/times.json
    measure.py OUT --figures [--criterion DIR]            OUT/times.json + criterion -> figures.json
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
from benchlib import timed_run  # noqa: E402

AT = 10**10        # where the runs resume
SOURCES = 100      # the fixture 100 times, weights 1..100
AFTER = 8          # samples the plans hold past the cursor: the first batch


def plan(root: str, samples: int) -> dict:
    sources = [{"uri": f"{root}/r50k_int32", "weight": w} for w in range(1, SOURCES + 1)]
    return {"sources": sources, "seq_len": 255, "batch_size": 8, "samples": samples,
            "seed": 3, "output": "u16"}


def measure(a) -> None:
    out = pathlib.Path(a.out)
    local, remote = out / "resume.json", out / "resume-agent.json"
    local.write_text(json.dumps(plan(a.fixtures, AT + AFTER)))
    remote.write_text(json.dumps(plan("fx", AT + AFTER)))
    # The cursor a checkpoint at 10^10 holds: the blend's per-source counts there, from
    # `dquant audit` (the climb), so the resume replays nothing.
    audit = json.loads(timed_run([a.dquant, "audit", str(local), "--until", str(AT), "--json"])[1])
    blend = [s["samples"] for s in audit["sources"]]
    if sum(blend) != AT:
        sys.exit(f"audit's per-source samples sum to {sum(blend)}, not {AT}")
    cursor = json.dumps({"consumed_samples": AT, "blend": blend})
    read = [a.dquant, "read", "-q", "--out", "/dev/null"]
    times: dict[str, list[float]] = {"inproc": [], "start": [], "bare": [], "agent": []}
    with benchlib.Agent(a.dquant, ["--root", f"fx={a.fixtures}"]) as agent:
        for _ in range(a.runs):
            times["inproc"].append(timed_run([*read, str(local), "--cursor-json", cursor])[0])
            times["start"].append(timed_run([*read, str(local), "--cursor", str(AT - AFTER)])[0])
            times["bare"].append(timed_run([*read, str(local), "--cursor", str(AT)])[0])
            times["agent"].append(timed_run([*read, str(remote), "--agent", agent.uri,
                                             "--cursor-json", cursor])[0])
    json.dump({"times": times}, open(out / "times.json", "w"), indent=1)
    print(json.dumps({k: [round(x * 1e3, 2) for x in v] for k, v in times.items()}), "ms")


def estimate(criterion: pathlib.Path, group: str, name: str) -> float:
    """Criterion's mean of one benchmark, in nanoseconds."""
    f = criterion / group / name / "new" / "estimates.json"
    return json.loads(f.read_text())["mean"]["point_estimate"]


def figures(a) -> None:
    out, crit = pathlib.Path(a.out), pathlib.Path(a.criterion)
    t = json.load(open(out / "times.json"))["times"]
    ms = {k: [x * 1e3 for x in v] for k, v in t.items()}
    res = lambda n, at: estimate(crit, "scale_resume", f"with counts, {n} sources, at {at}")
    replay = lambda n: estimate(crit, "scale_resume", f"replay per sample, {n} sources") / 1e6
    batch = lambda w, n: estimate(crit, "scale_batch", f"world {w}, {n} sources")
    figs = []
    for n in (100, 8):
        r = replay(n)
        figs.append({
            "name": f"first batch after resume with counts at 10¹⁰ samples, {n} sources (criterion)",
            "value": round(res(n, 10**10) / 1e3, 2), "unit": "µs",
            "baseline": f"replay without counts: {r:.1f} ns a sample ({r * 1e10 / 1e9 / 60:.1f} min to "
                        f"10¹⁰); with counts at 10⁹ {res(n, 10**9) / 1e3:.2f} µs",
            "goal": "<= 50000" if n == 100 else None})
    figs.append({
        "name": f"resume at 10¹⁰, {SOURCES} sources, in-process end to end (open {SOURCES} sources, "
                f"first batch; worst of {len(ms['inproc'])} runs)",
        "value": round(max(ms["inproc"]), 1), "unit": "ms",
        "baseline": f"the same CLI from a bare cursor at 10¹⁰ (the climb in place of the counts): "
                    f"{benchlib.spread(ms['bare'], '{:.1f}'.format)} ms; at 10¹⁰ − 8 with the "
                    f"batch before: {benchlib.spread(ms['start'], '{:.1f}'.format)} ms",
        "goal": "<= 50"})
    figs.append({
        "name": f"resume at 10¹⁰, {SOURCES} sources, through the agent end to end (connect, Open, "
                f"first batch; worst of {len(ms['agent'])} runs)",
        "value": round(max(ms["agent"]), 1), "unit": "ms",
        "baseline": f"in-process, same run: {benchlib.spread(ms['inproc'], '{:.1f}'.format)} ms; "
                    f"agent runs {benchlib.spread(ms['agent'], '{:.1f}'.format)} ms",
        "goal": "<= 50"})
    for n, how, goal in [(1000, "kinetic tournament", "<= 2"), (100, "kinetic tournament", None),
                         (1, "O(1) jump", None)]:
        v, base = batch(4096, n), batch(1, n)
        unit, div = ("ms", 1e6) if v >= 1e5 else ("µs", 1e3)
        figs.append({
            "name": f"schedule cost per batch of 8, world 4096 × {n:,} source{'s' if n > 1 else ''} ({how})",
            "value": round(v / div, 2 if unit == "ms" else 3), "unit": unit,
            "baseline": f"world 1 × {n:,}, same run: {base / 1e3:.2f} µs; world 512: "
                        f"{batch(512, n) / 1e3:,.1f} µs",
            "goal": goal})
    json.dump({"figures": figs}, open(out / "figures.json", "w"), indent=1, ensure_ascii=False)
    print(benchlib.figures_table(figs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dquant")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fixtures")
    ap.add_argument("--figures", action="store_true")
    ap.add_argument("--criterion", default="target/criterion")
    a = ap.parse_args()
    figures(a) if a.figures else measure(a)


if __name__ == "__main__":
    main()
