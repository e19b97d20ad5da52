#!/usr/bin/env python3
"""Provenance at 10^10 samples, timed through the release CLI (see run.sh), and the figures.

    measure.py OUT --dquant BIN --runs N --fixtures DIR   time each question, write OUT/times.json
    measure.py OUT --figures                              OUT/times.json + throughput-*.json -> figures.json
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchlib import timed_run  # noqa: E402

AT = 10**10            # where the questions are asked
TOTAL = 2 * 10**10     # the plan's samples
REPLAY_AT = 10**7      # where the replay baseline is timed (scaled to AT)
TAIL = 10**6           # the inverse look-up's window: the last 10^6 samples


def plan(fixtures, samples, extra=""):
    lines = [f"seq_len = 255", "batch_size = 8", f"samples = {samples}", "seed = 3", 'output = "u16"', extra]
    for name, w in [("r50k_int32", 0.5), ("r50k_int32_multiseq", 0.3), ("r50k_uint16", 0.2)]:
        lines += ["[[sources]]", f'uri = "{fixtures}/{name}"', f"weight = {w}"]
        if "renormalize" in extra:
            lines.append(f"max_samples = {samples}")
    return "\n".join(lines) + "\n"


def measure(a):
    out = pathlib.Path(a.out)
    big, resume, replay = out / "big.toml", out / "resume.toml", out / "replay.toml"
    big.write_text(plan(a.fixtures, TOTAL))
    resume.write_text(plan(a.fixtures, AT + 64))
    replay.write_text(plan(a.fixtures, REPLAY_AT + 64, 'when_exhausted = "renormalize"'))
    q = {
        "resume": [a.dquant, "read", str(resume), "--cursor", str(AT), "-q", "--out", "/dev/null"],
        "replay": [a.dquant, "read", str(replay), "--cursor", str(REPLAY_AT), "-q", "--out", "/dev/null"],
        "locate": [a.dquant, "locate", str(big), "--sample", str(AT), "--json"],
        "inverse": [a.dquant, "locate", str(big), "--document", "0:5", "--range", f"{TOTAL - TAIL}..{TOTAL}", "--json"],
        "audit": [a.dquant, "audit", str(big), "--until", str(AT), "--json"],
        "start": [a.dquant, "locate", str(big), "--sample", "0", "--json"],
    }
    times = {k: [] for k in q}
    outs = {}
    for _ in range(a.runs):
        for k, cmd in q.items():
            dt, stdout = timed_run(cmd)
            times[k].append(dt)
            outs[k] = stdout
    found = json.loads(outs["inverse"])["samples"]
    # Each sample the inverse found holds a token of document 0:5 (checked forward).
    for s in found[:: max(1, len(found) // 20)]:
        at = json.loads(timed_run([a.dquant, "locate", str(big), "--sample", str(s), "--json"])[1])
        assert any(p["source"] == 0 and p["document"] == 5 for p in at["pieces"]), at
    audit = json.loads(outs["audit"])
    json.dump({"times": times, "inverse_samples": len(found), "audit": audit}, open(out / "times.json", "w"), indent=1)
    print(json.dumps({k: round(min(v), 4) for k, v in times.items()}), f"inverse found {len(found)}")


def throughput(out, tag, case):
    rates = []
    for f in sorted(out.glob(f"throughput-{tag}-*.json")):
        rates += [m["mtok_per_s"] for m in json.load(open(f))["measurements"] if m["case"] == case]
    return max(rates)


def figures(a):
    out = pathlib.Path(a.out)
    t = json.load(open(out / "times.json"))
    best = {k: min(v) for k, v in t["times"].items()}
    replay = best["replay"] * AT / REPLAY_AT
    figs = [
        {"name": "resume from a bare cursor at 10^10 samples (3-source blend): time to the first batch",
         "value": round(best["resume"], 4), "unit": "s",
         "baseline": f"a replay of the blend from 0 to 10^10: {replay:.0f} s (timed at 10^7 in this run, scaled); the same CLI at sample 0: {best['start']:.4f} s",
         "goal": "<= 1"},
        {"name": "locate --sample at 10^10: time", "value": round(best["locate"], 4), "unit": "s",
         "baseline": f"the same CLI at sample 0: {best['start']:.4f} s", "goal": None},
        {"name": f"locate --document over the last 10^6 of 2·10^10 samples: time ({t['inverse_samples']} samples found)",
         "value": round(best["inverse"], 4), "unit": "s",
         "baseline": f"a replay of those 10^6 samples alone: {best['replay'] * TAIL / REPLAY_AT:.3f} s, of the blend up to them: {replay * 2:.0f} s",
         "goal": "<= 1"},
        {"name": "audit --until 10^10: time", "value": round(best["audit"], 4), "unit": "s",
         "baseline": f"a replay of the blend from 0 to 10^10: {replay:.0f} s", "goal": "<= 1"},
    ]
    for case, what in [("inproc", "in-process"), ("agent-shm", "agent over shared memory")]:
        off, on = throughput(out, "off", case), throughput(out, "on", case)
        figs.append({"name": f"provenance = true, {what}: rate with it / without", "value": round(on / off, 3), "unit": "×",
                     "baseline": f"without, same run, alternated: {off:.0f} M tokens/s (with: {on:.0f}); 4,096-token samples, batch 8, u16", "goal": None})
    json.dump({"figures": figs}, open(out / "figures.json", "w"), indent=1, ensure_ascii=False)
    for f in figs:
        print(f"{f['name']}: {f['value']} {f['unit']}  ({f['baseline']})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dquant")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fixtures")
    ap.add_argument("--figures", action="store_true")
    a = ap.parse_args()
    figures(a) if a.figures else measure(a)


if __name__ == "__main__":
    main()
