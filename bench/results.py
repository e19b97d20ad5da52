#!/usr/bin/env python3
"""Benchmark results: one JSON file per area in bench/results/, and bench/RESULTS.md made from
them. Nobody edits RESULTS.md by hand; CI (`.ci/run`) fails when it is not what `render`
makes from the JSON and the repository as it is now.

Why: a figure measured at one commit says nothing about code changed since. Each result names
the paths it depends on (`depends_on`: the bench that measures and the product code on the
measured path); when any of them has changed since the result's commit, the generator marks
the area's figures stale, in the table, with the changed files. A stale figure is never left
standing as current: rerun the area's command, or delete its file.

    bench/results.py render                 write bench/RESULTS.md
    bench/results.py check                  fail if RESULTS.md is not what render writes
    bench/results.py validate FILE          check a figures file a benchmark wrote
    bench/results.py record AREA --figures FILE --command CMD [--title T]
                            [--depends-on PATH ...] [--machine TEXT] [--notes TEXT]
        A benchmark's new result: FILE holds {"figures": [...]} (see FIGURE_KEYS); commit,
        date and machine are filled in here. The area's previous result is appended to
        bench/history/AREA.jsonl (append-only) before it is replaced, and RESULTS.md is
        rendered again.

A figure's `goal` is "<= X" or ">= X" (in the figure's unit) or null; whether it is met is
computed here, in one place, never written by hand.

Only the standard library: CI runs `check` with the system python3.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
HISTORY = REPO / "bench" / "history"
OUT = REPO / "bench" / "RESULTS.md"

AREA_KEYS = ["area", "title", "command", "commit", "date", "machine", "depends_on", "history",
             "notes", "figures"]
REQUIRED = {"area", "title", "command", "commit", "date", "machine", "depends_on", "figures"}
FIGURE_KEYS = ["name", "value", "unit", "baseline", "goal"]


class ResultError(Exception):
    """A result file that does not follow the schema, or a commit this clone lacks."""


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


# ---------------------------------------------------------------- reading and checking


def parse_goal(goal) -> tuple[str, float] | None:
    if goal is None:
        return None
    if not isinstance(goal, str):
        raise ResultError(f"goal {goal!r}: a string such as '>= 0.8', or null")
    op, _, num = goal.partition(" ")
    if op not in ("<=", ">=", "<", ">"):
        raise ResultError(f"goal {goal!r}: starts with <=, >=, < or >, then a space")
    try:
        return op, float(num)
    except ValueError:
        raise ResultError(f"goal {goal!r}: {num!r} is not a number") from None


def met(figure: dict) -> bool | None:
    """Whether the figure meets its goal; None when it has none."""
    g = parse_goal(figure.get("goal"))
    if g is None:
        return None
    op, x = g
    v = figure["value"]
    return {"<=": v <= x, ">=": v >= x, "<": v < x, ">": v > x}[op]


def check_figure(f: dict, where: str) -> None:
    if not isinstance(f, dict):
        raise ResultError(f"{where}: a figure is an object with {FIGURE_KEYS}")
    missing = [k for k in ("name", "value", "unit", "baseline") if k not in f]
    extra = [k for k in f if k not in FIGURE_KEYS]
    if missing or extra:
        raise ResultError(f"{where}: figure {f.get('name')!r}: missing {missing}, unknown {extra}")
    if isinstance(f["value"], bool) or not isinstance(f["value"], (int, float)):
        raise ResultError(f"{where}: figure {f['name']!r}: value {f['value']!r} is not a number")
    try:
        parse_goal(f.get("goal"))
    except ResultError as e:
        raise ResultError(f"{where}: figure {f['name']!r}: {e}") from None


def load(path: Path) -> dict:
    where = str(path.relative_to(REPO))
    try:
        r = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultError(f"{where}: not JSON: {e}") from None
    if not isinstance(r, dict):
        raise ResultError(f"{where}: a result is a JSON object")
    missing = sorted(REQUIRED - set(r))
    extra = sorted(set(r) - set(AREA_KEYS))
    if missing or extra:
        raise ResultError(f"{where}: missing keys {missing}, unknown keys {extra}")
    if r["area"] != path.stem:
        raise ResultError(f"{where}: area {r['area']!r} is not the file's name")
    if not r["figures"]:
        raise ResultError(f"{where}: no figures")
    for f in r["figures"]:
        check_figure(f, where)
    if r.get("history") and not (REPO / r["history"]).exists():
        raise ResultError(f"{where}: history {r['history']!r} does not exist")
    if not isinstance(r["depends_on"], list) or not r["depends_on"]:
        raise ResultError(f"{where}: depends_on lists the paths the figures depend on")
    for p in r["depends_on"]:
        # What this script writes cannot make a result stale: RESULTS.md would never settle.
        if (REPO / p).resolve() in {REPO, REPO / "bench", RESULTS, HISTORY, OUT}:
            raise ResultError(f"{where}: depends_on {p!r} holds the results themselves; name the code")
        if not (REPO / p).exists():
            raise ResultError(f"{where}: depends_on {p!r} does not exist (renamed? update it)")
    if git("cat-file", "-e", f"{r['commit']}^{{commit}}").returncode != 0:
        raise ResultError(
            f"{where}: commit {r['commit']} is not in this clone's history "
            "(a shallow clone? `git fetch --unshallow`)"
        )
    return r


def changed_since(r: dict) -> list[str]:
    """Files under the result's depends_on that differ between its commit and the work tree."""
    p = git("diff", "--name-only", r["commit"], "--", *r["depends_on"])
    if p.returncode != 0:
        raise ResultError(f"{r['area']}: git diff failed: {p.stderr.strip()}")
    # New files git does not track yet count too (git diff leaves them out).
    new = git("ls-files", "--others", "--exclude-standard", "--", *r["depends_on"])
    return sorted({line for line in (p.stdout + new.stdout).splitlines() if line})


def load_all() -> list[dict]:
    return [load(p) for p in sorted(RESULTS.glob("*.json"))]


# ---------------------------------------------------------------- rendering


def number(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"


def mark(f: dict, stale: bool) -> str:
    if stale:
        return "stale"
    m = met(f)
    return "" if m is None else ("✅" if m else "❌")


def render_area(r: dict, changed: list[str]) -> list[str]:
    stale = bool(changed)
    out = [f"## {r['title']}", ""]
    if stale:
        shown = ", ".join(f"`{c}`" for c in changed[:6]) + (" …" if len(changed) > 6 else "")
        out += [f"**Stale**: changed since `{r['commit'][:10]}`: {shown}. Rerun the command to "
                "measure the code as it is now.", ""]
    out += [
        f"- Command: `{r['command']}`",
        f"- Commit `{r['commit'][:10]}`, {r['date']}, {r['machine']}",
        f"- Depends on: {', '.join(f'`{p}`' for p in r['depends_on'])}",
    ]
    if r.get("history"):
        out.append(f"- Write-up and earlier runs: [{r['history']}]({Path(r['history']).relative_to('bench')})")
    # Notes in paragraphs (blank lines between them) render as one bullet each.
    out += [f"- {p.strip()}" for p in (r.get("notes") or "").split("\n\n") if p.strip()]
    out += ["", "| figure | value | baseline (same run) | goal | met |", "|---|---:|---|---|:-:|"]
    for f in r["figures"]:
        value = f"{number(f['value'])} {f['unit']}".strip()
        if stale:
            value = f"~~{value}~~"
        out.append(f"| {f['name']} | {value} | {f['baseline']} | {f.get('goal') or ''} | {mark(f, stale)} |")
    return out + [""]


def render(results: list[dict]) -> str:
    changed = {r["area"]: changed_since(r) for r in results}
    lines = [
        "# Benchmark results",
        "",
        "<!-- Generated by bench/results.py from bench/results/*.json: do not edit by hand. -->",
        "",
        "The current figure of every benchmark area, each against a baseline measured in the same",
        "run (the machines are shared and noisy). Each area names the command that measures it,",
        "the commit and the machine. An area whose code has changed since its commit is marked",
        "**stale** and its figures struck out, until its command runs again.",
        "[docs/benchmarks.md](../docs/benchmarks.md) says how each is measured;",
        "[history/](history/) keeps every earlier result and write-up.",
        "",
        "| area | figures | goals met | commit | date | status |",
        "|---|---:|---:|---|---|---|",
    ]
    for r in results:
        goals = [met(f) for f in r["figures"] if f.get("goal") is not None]
        status = "stale" if changed[r["area"]] else "current"
        met_text = f"{sum(1 for g in goals if g)} of {len(goals)}" if goals else "–"
        anchor = r["title"].lower()
        anchor = "".join(c for c in anchor if c.isalnum() or c in " -_").replace(" ", "-")
        lines.append(f"| [{r['area']}](#{anchor}) | {len(r['figures'])} | {met_text} | "
                     f"`{r['commit'][:10]}` | {r['date']} | {status} |")
    lines.append("")
    for r in results:
        lines += render_area(r, changed[r["area"]])
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- recording


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines()
                   if l.startswith("MemTotal"))
        return f"{os.cpu_count()} vCPU {cpu}, {mem / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        return f"{os.cpu_count()} vCPU {cpu}"


def read_figures(path: str) -> list[dict]:
    """A benchmark's figures file, {"figures": [...]}, each figure checked."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ResultError(f"{path}: {e}") from None
    figures = doc.get("figures") if isinstance(doc, dict) else None
    if not isinstance(figures, list) or not figures:
        raise ResultError(f'{path}: expected {{"figures": [...]}} with at least one figure')
    for f in figures:
        check_figure(f, path)
    return figures


def record(a: argparse.Namespace) -> None:
    path = RESULTS / f"{a.area}.json"
    old = json.loads(path.read_text()) if path.exists() else None
    figures = read_figures(a.figures)
    depends_on = a.depends_on or (old or {}).get("depends_on")
    if not depends_on:
        raise ResultError(f"{a.area}: a new area needs --depends-on (the paths its figures depend on)")
    head = git("rev-parse", "HEAD").stdout.strip()
    dirty = git("status", "--porcelain", "--", *depends_on).stdout.strip()
    if dirty:
        raise ResultError(
            f"{a.area}: uncommitted changes under its depends_on, so no commit names what was "
            f"measured; commit them and run again:\n{dirty}"
        )
    new = {
        "area": a.area,
        "title": a.title or (old or {}).get("title") or a.area,
        "command": a.command,
        "commit": head,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": a.machine or machine(),
        "depends_on": depends_on,
        "history": f"bench/history/{a.area}.jsonl" if old is not None else "",
        # Not carried over: an old note may describe figures this run replaced.
        "notes": a.notes or "",
        "figures": [{k: f.get(k) for k in FIGURE_KEYS} for f in figures],
    }
    if old is not None:
        HISTORY.mkdir(exist_ok=True)
        with open(HISTORY / f"{a.area}.jsonl", "a") as h:
            h.write(json.dumps(old, ensure_ascii=False) + "\n")
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(new, indent=2, ensure_ascii=False) + "\n")
    load(path)
    OUT.write_text(render(load_all()))
    print(f"bench/results.py: {path.relative_to(REPO)} recorded; bench/RESULTS.md rendered")


# ---------------------------------------------------------------- command line


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("render", help="write bench/RESULTS.md")
    sub.add_parser("check", help="fail if bench/RESULTS.md is not what render writes")
    val = sub.add_parser("validate", help="check a figures file a benchmark wrote")
    val.add_argument("file")
    rec = sub.add_parser("record", help="a benchmark's new result for AREA")
    rec.add_argument("area")
    rec.add_argument("--figures", required=True, help='JSON: {"figures": [...]}')
    rec.add_argument("--command", required=True, help="the command that measured them")
    rec.add_argument("--title")
    rec.add_argument("--depends-on", nargs="+", metavar="PATH")
    rec.add_argument("--machine")
    rec.add_argument("--notes")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "render":
            OUT.write_text(render(load_all()))
            print("bench/results.py: bench/RESULTS.md rendered")
        elif a.cmd == "check":
            want = render(load_all())
            if OUT.read_text() != want:
                print("bench/results.py: bench/RESULTS.md is not what bench/results/*.json and "
                      "the code now give (a result changed, or its code did and its figures are "
                      "now stale): run `bench/results.py render` and commit it", file=sys.stderr)
                return 1
            print("bench/results.py: bench/RESULTS.md is current")
        elif a.cmd == "validate":
            n = len(read_figures(a.file))
            print(f"bench/results.py: {a.file}: {n} figures, each in the schema")
        else:
            record(a)
    except ResultError as e:
        print(f"bench/results.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
