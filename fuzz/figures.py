#!/usr/bin/env python3
"""Fuzz campaign summaries, and the fuzz area's figures from them.

Why: a campaign's log (fuzz/logs/, ignored by git) is gone once the machine that ran it is, so
figures read from logs could not be checked against anything kept. Each campaign run of a
target now leaves a small summary in git, `fuzz/runs/<UTC time>-<target>.json`: the target,
the executions asked for and done, libFuzzer's final stats (its `stat::` lines, its last status
line and its `Done` line, verbatim), the inputs it wrote (crashes, hangs, OOMs), the corpus
directory's size and hash after the run, the date, commit and machine. The area's figures are
made from those summaries and name the one each comes from.

    fuzz/figures.py summary TARGET LOG --runs N --corpus DIR   # writes fuzz/runs/..., prints it
    fuzz/figures.py figures --runs N [TARGET...]               # figures JSON on stdout
    fuzz/figures.py machine --runs N [TARGET...]               # the machine they ran on

`figures` takes, for each target, the newest summary of a campaign of N runs (all targets when
none is named) and fails when a target has none; `machine` says what ran those summaries
(one machine, or it fails), for the record. Only the standard
library (and bench/results.py's description of the machine)."""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS_DIR = HERE / "runs"
sys.path.insert(0, str(HERE.parent / "bench"))
from results import machine  # noqa: E402

HEADER = re.compile(r"^== fuzz campaign: (\S+) \((\d+) runs\)")
STAT = re.compile(r"^stat::(\w+):\s+(\d+)")
STATUS = re.compile(r"cov: (\d+) ft: \d+ corp: (\d+)/")
DONE = re.compile(r"^Done (\d+) runs in (\d+) second")
WROTE = re.compile(r"^Test unit written to (\S+)")
# What the targets are built from, relative to fuzz/.
BUILT = ("fuzz_targets", "src", "seeds", "Cargo.toml", "Cargo.lock", "../crates", "../Cargo.lock")


class FuzzError(Exception):
    """A log or summary that cannot give what is asked of it."""


def parse_log(path: Path, target: str) -> dict:
    """The campaign of `target` in its log: runs asked, libFuzzer's final stats, its last
    status and `Done` lines, and the inputs it wrote."""
    s: dict = {"stats": {}, "written": [], "status_line": None, "done_line": None}
    seen = False
    for line in path.read_text(errors="replace").splitlines():
        if m := HEADER.match(line):
            seen = m.group(1) == target
            if seen:
                s = {"stats": {}, "written": [], "status_line": None, "done_line": None,
                     "runs_asked": int(m.group(2))}
        elif not seen:
            continue
        elif m := STAT.match(line):
            s["stats"][m.group(1)] = int(m.group(2))
        elif DONE.match(line):
            s["done_line"] = line.strip()
        elif m := WROTE.match(line):
            s["written"].append(m.group(1))
        elif STATUS.search(line):
            s["status_line"] = line.strip()
    if "runs_asked" not in s:
        raise FuzzError(f"{path}: no `== fuzz campaign: {target}` header")
    if "number_of_executed_units" not in s["stats"]:
        raise FuzzError(f"{path}: {target}: no final stats (did the run finish?)")
    return s


def corpus_digest(corpus: Path) -> dict:
    """The corpus directory after the run: its inputs, bytes, and a sha256 over each input's
    name and content in name order."""
    h = hashlib.sha256()
    files = sorted(p for p in corpus.iterdir() if p.is_file()) if corpus.is_dir() else []
    size = 0
    for p in files:
        data = p.read_bytes()
        size += len(data)
        h.update(p.name.encode() + b"\0" + hashlib.sha256(data).digest())
    return {"inputs": len(files), "bytes": size, "sha256": h.hexdigest()}


def git(*args: str) -> str:
    r = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def summarize(target: str, log: Path, runs: int, corpus: Path, out: Path) -> Path:
    """Writes the summary of `target`'s campaign in `log` to `out`; returns its path."""
    s = parse_log(log, target)
    if s["runs_asked"] != runs:
        raise FuzzError(f"{log}: {target} was asked {s['runs_asked']} runs, not {runs}")
    now = dt.datetime.now(dt.timezone.utc)
    summary = {
        "target": target, "date": now.strftime("%Y-%m-%dT%H:%MZ"),
        "commit": git("rev-parse", "HEAD") or "unknown",
        # Whether the code the targets build differed from the commit.
        "dirty": bool(git("status", "--porcelain", "--", *BUILT)),
        "machine": machine(), "runs_asked": runs,
        "executions": s["stats"]["number_of_executed_units"],
        "written": s["written"], "corpus": corpus_digest(corpus),
        "final_stats": s["stats"], "status_line": s["status_line"], "done_line": s["done_line"],
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{now.strftime('%Y%m%dT%H%M%SZ')}-{target}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def latest(runs: int, targets: list[str], where: Path) -> dict[str, tuple[Path, dict]]:
    """Per target, the newest summary of a campaign of `runs` runs in `where`."""
    found: dict[str, tuple[Path, dict]] = {}
    for path in sorted(where.glob("*.json")):
        try:
            s = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise FuzzError(f"{path}: {e}") from None
        if s.get("runs_asked") == runs and (not targets or s.get("target") in targets):
            found[s["target"]] = (path, s)  # names sort by time: the last is the newest
    missing = [t for t in targets if t not in found]
    if missing:
        raise FuzzError(f"no summary of a {runs}-run campaign in {where} for "
                        f"{', '.join(missing)}")
    if not found:
        raise FuzzError(f"no summary of a {runs}-run campaign in {where}")
    return found


def figures(found: dict[str, tuple[Path, dict]], runs: int) -> list[dict]:
    """Per target: executions (goal: the run count) and inputs written (goal: none)."""
    figs = []
    for t, (path, s) in sorted(found.items()):
        st, c = s["final_stats"], s["corpus"]
        status = STATUS.search(s["status_line"] or "")
        edges = f"{int(status.group(1)):,} edges, " if status else ""
        secs = DONE.match(s["done_line"] or "")
        over = f" over {secs.group(2)} s" if secs else ""
        context = (f"{edges}corpus {c['inputs']:,} inputs (sha256 {c['sha256'][:12]}), "
                   f"{st.get('average_exec_per_sec', 0):,} exec/s{over}; "
                   f"fuzz/runs/{path.name}")
        figs.append({"name": f"`{t}`: executions", "value": s["executions"], "unit": "",
                     "baseline": context, "goal": f">= {runs}"})
        figs.append({"name": f"`{t}`: crashes, hangs, OOMs", "value": len(s["written"]),
                     "unit": "", "baseline": "inputs libFuzzer wrote to fuzz/artifacts",
                     "goal": "<= 0"})
    return figs


def one_machine(found: dict[str, tuple[Path, dict]]) -> str:
    """The machine every summary in `found` ran on."""
    machines = {s["machine"]: path.name for path, s in found.values()}
    if len(machines) != 1:
        raise FuzzError("the summaries ran on more than one machine: " +
                        "; ".join(f"{m} ({p})" for m, p in sorted(machines.items())))
    return next(iter(machines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sm = sub.add_parser("summary", help="a target's campaign log into fuzz/runs/")
    sm.add_argument("target")
    sm.add_argument("log", type=Path)
    sm.add_argument("--runs", type=int, required=True, help="the executions asked of it")
    sm.add_argument("--corpus", type=Path, required=True, help="its corpus directory")
    sm.add_argument("--out", type=Path, default=RUNS_DIR)
    fg = sub.add_parser("figures", help="the area's figures from the summaries")
    fg.add_argument("--runs", type=int, required=True, help="the executions each target needs")
    fg.add_argument("--summaries", type=Path, default=RUNS_DIR)
    fg.add_argument("targets", nargs="*")
    mc = sub.add_parser("machine", help="the machine the summaries `figures` takes ran on")
    mc.add_argument("--runs", type=int, required=True)
    mc.add_argument("--summaries", type=Path, default=RUNS_DIR)
    mc.add_argument("targets", nargs="*")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "summary":
            print(summarize(a.target, a.log, a.runs, a.corpus, a.out))
        elif a.cmd == "figures":
            found = latest(a.runs, a.targets, a.summaries)
            json.dump({"figures": figures(found, a.runs)}, sys.stdout, indent=2)
            print()
        else:
            print(one_machine(latest(a.runs, a.targets, a.summaries)))
    except (FuzzError, OSError) as e:
        print(f"fuzz/figures.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
