#!/usr/bin/env python3
"""Benchmark results: one JSON file per area in bench/results/, and bench/RESULTS.md made from
them, and every figure the README and the guides quote. Nobody edits RESULTS.md or a
generated block by hand; CI (`.ci/run`) fails when one is not what `render` makes from the
JSON and the repository as it is now.

Why: a figure measured at one commit says nothing about code changed since, and a figure
typed into a doc says nothing once the area is measured again. Each result names the paths
it depends on (`depends_on`); when any of them has changed since the result's commit, the
generator marks the area's figures stale, in the table and in every block that quotes them,
with the changed files. `depends_on` is derived, never listed by hand: RUNS below says what
each area's command runs (binaries, criterion benches, the Python extension, its scripts),
and `cargo metadata` gives the workspace crates those reach, so a change in any crate on the
measured path (dquant-storage under everything that reads) stales the area.

    bench/results.py render                 write bench/RESULTS.md and the generated blocks
                                            of README.md and docs/*.md
    bench/results.py check                  fail if any of them is not what render writes, or
                                            a stored depends_on is not the derived one
    bench/results.py derive                 write each result's depends_on as derived now
    bench/results.py validate FILE          check a figures file a benchmark wrote
    bench/results.py record AREA --figures FILE --command CMD [--title T]
                            [--machine TEXT] [--notes TEXT]
        A benchmark's new result: FILE holds {"figures": [...]} (see FIGURE_KEYS); commit,
        date, depends_on (from RUNS) and machine (from /proc unless given) are filled in here.
        The area's previous result is appended to bench/history/AREA.jsonl (append-only)
        before it is replaced, and everything is rendered again.

A generated block, in README.md or docs/*.md, quotes figures of one area:

    <!-- generated:AREA figure="NAME" [digits=N] [unit=TEXT] -->…<!-- end generated -->

NAME is a figure's name; `*` in it matches any text up to a comma (one part of a name such as
"TCP, 8 subscribers"), and several figures render as their range, "min–max". digits=N gives
N decimals (default: three significant digits, as in RESULTS.md); unit=TEXT replaces the figures' unit ("" for none). "×" and "%" follow the value
directly, other units after a space ("60 configs", "4.1 ms"). A stale area's figure renders
with "(stale)" after it. Written in backticks, `<!-- generated:…` is an example, not a block.

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
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
HISTORY = REPO / "bench" / "history"
OUT = REPO / "bench" / "RESULTS.md"
# The docs whose generated blocks `render` rewrites (RESULTS.md aside).
DOCS = ["README.md", "docs/*.md"]

AREA_KEYS = ["area", "title", "command", "commit", "date", "machine", "depends_on", "history",
             "notes", "figures"]
REQUIRED = {"area", "title", "command", "commit", "date", "machine", "depends_on", "figures"}
FIGURE_KEYS = ["name", "value", "unit", "baseline", "goal"]


class ResultError(Exception):
    """A result file that does not follow the schema, or a commit this clone lacks."""


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


# ---------------------------------------------------------------- what each area runs


@dataclass(frozen=True)
class Runs:
    """What an area's command runs. Its depends_on is derived from this (`derived_depends_on`)."""

    bins: tuple[str, ...] = ()  # workspace binaries it starts, by target name
    benches: tuple[str, ...] = ()  # packages whose criterion benches it runs (dev-deps count)
    packages: tuple[str, ...] = ()  # packages it builds and runs whole (the fuzz targets)
    python: bool = False  # the Python extension (python/Cargo.toml) and package (python/python)
    scripts: tuple[str, ...] = ()  # its bench folder, shared scripts, what sets up its venv


BOTH = ("dquant", "dquant-offload-bench")
COMMON = "bench/common.sh"  # sourced: the machine's description, the Zipf datasets, the cache
BENCHLIB = "bench/benchlib.py"  # imported: the agent child process, /proc figures
TEST_VENV = "python/requirements-test.txt"  # the venv python/test.sh --no-tests builds

# One place: which binaries, benches and packages each area's command runs.
RUNS: dict[str, Runs] = {
    "chaos": Runs(bins=("dquant",), python=True, scripts=("bench/chaos", BENCHLIB, TEST_VENV)),
    "codecs": Runs(bins=("dquant",), benches=("dquant-codec",), scripts=("bench/codecs",)),
    "cost": Runs(bins=BOTH, python=True, scripts=("bench/cost", COMMON, BENCHLIB, TEST_VENV)),
    "fanout": Runs(bins=BOTH, scripts=("bench/share", COMMON)),
    "fuzz": Runs(packages=("dquant-fuzz",)),
    "gpu_feed": Runs(bins=("dquant",), python=True, scripts=("bench/gpu", BENCHLIB, TEST_VENV)),
    "hostile_load": Runs(bins=BOTH, scripts=("bench/load", COMMON, BENCHLIB)),
    "lab": Runs(bins=BOTH, scripts=("bench/lab/run.sh",)),
    "lab_tenants": Runs(bins=BOTH, scripts=("bench/lab/run.sh",)),
    "megatron": Runs(bins=("dquant",), python=True,
                     scripts=("bench/megatron", BENCHLIB, TEST_VENV)),
    "megatron_equivalence": Runs(bins=("dquant",), python=True,
                                 scripts=("bench/megatron", TEST_VENV, "python/tests/conftest.py",
                                          "python/tests/test_megatron_order.py")),
    "mount": Runs(bins=("dquant",), scripts=("bench/mount", BENCHLIB, "bench/python/requirements.txt")),
    "offload": Runs(bins=BOTH, scripts=("bench/offload", COMMON, BENCHLIB)),
    "profile": Runs(bins=BOTH, benches=("dquant-plan", "dquant-storage"), python=True,
                    scripts=("bench/profile", COMMON, BENCHLIB, "bench/python")),
    "provenance": Runs(bins=BOTH, scripts=("bench/provenance", COMMON, BENCHLIB)),
    "python_loaders": Runs(bins=("dquant",), python=True, scripts=("bench/python", BENCHLIB)),
    "resume": Runs(bins=("dquant",), benches=("dquant-plan",),
                   scripts=("bench/resume", COMMON, BENCHLIB)),
    "ring": Runs(bins=BOTH, scripts=("bench/ring", COMMON, BENCHLIB)),
    "scale": Runs(bins=BOTH, benches=("dquant-plan",),
                  scripts=("bench/scale", COMMON, BENCHLIB, "bench/lab/run.sh")),
    "tls": Runs(bins=BOTH, scripts=("bench/tls", COMMON, BENCHLIB)),
    "worker_pool": Runs(bins=BOTH, scripts=("bench/worker_pool", COMMON, BENCHLIB)),
}

# The cargo workspaces: the main one, the Python extension's, the fuzz targets'.
MANIFESTS = ["Cargo.toml", "python/Cargo.toml", "fuzz/Cargo.toml"]
PYTHON_MANIFEST = "python/Cargo.toml"
PYTHON_PACKAGE = "python/python"


def cargo_packages() -> dict[str, dict]:
    """The path packages of every workspace in MANIFESTS, by directory (relative to REPO).

    `--no-deps`: the manifests alone, so nothing is resolved, fetched or written (Cargo.lock
    stays as it is, a scratch copy needs no registry). Path dependencies come from each
    package's dependency list; an optional one or one for another target counts as reached,
    which can only make an area stale more often, never less."""
    packages: dict[str, dict] = {}
    for manifest in MANIFESTS:
        if not (REPO / manifest).exists():
            continue
        try:
            p = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline",
                                "--manifest-path", str(REPO / manifest)], capture_output=True, text=True)
        except FileNotFoundError:
            raise ResultError("cargo is not on PATH: depends_on is derived with `cargo metadata`") from None
        if p.returncode != 0:
            raise ResultError(f"cargo metadata --manifest-path {manifest}: {p.stderr.strip()}")
        for pkg in json.loads(p.stdout)["packages"]:
            packages[relative_dir(Path(pkg["manifest_path"]).parent)] = pkg
    return packages


def relative_dir(path: Path) -> str:
    return Path(os.path.relpath(path.resolve(), REPO.resolve())).as_posix()


def reached(packages: dict[str, dict], start: str, dev: bool) -> set[str]:
    """The directories of `start` and every path package it depends on, transitively (normal
    and build dependencies; `start`'s dev-dependencies too when `dev`: its benches run)."""
    seen: set[str] = set()
    todo = [(start, dev)]
    while todo:
        d, with_dev = todo.pop()
        if d in seen:
            continue
        seen.add(d)
        for dep in packages[d]["dependencies"]:
            if dep.get("path") is None or (dep["kind"] == "dev" and not with_dev):
                continue
            target = relative_dir(Path(dep["path"]))
            if target not in packages:
                raise ResultError(f"{packages[d]['name']}: path dependency {target} is in none of "
                                  f"the workspaces {MANIFESTS}")
            todo.append((target, False))
    return seen


def package_dir(packages: dict[str, dict], area: str, *, binary: str = "", name: str = "") -> str:
    for d, pkg in packages.items():
        if name and pkg["name"] == name:
            return d
        if binary and any(binary == t["name"] and "bin" in t["kind"] for t in pkg["targets"]):
            return d
    what = f"binary {binary!r}" if binary else f"package {name!r}"
    raise ResultError(f"{area}: RUNS names {what}, which no workspace in {MANIFESTS} has")


def crate_paths(packages: dict[str, dict], d: str) -> list[str]:
    """What of a package the figures depend on: its directory; for the Python extension, whose
    directory is the Python project's (its tests too), the manifest and the Rust sources."""
    if d != str(Path(PYTHON_MANIFEST).parent):
        return [d]
    src = {relative_dir(Path(t["src_path"]).parent) for t in packages[d]["targets"]}
    return [PYTHON_MANIFEST, *sorted(src)]


def derived_depends_on(area: str, packages: dict[str, dict]) -> list[str]:
    runs = RUNS.get(area)
    if runs is None:
        raise ResultError(f"{area}: not in RUNS (bench/results.py): say there what its command "
                          "runs, and its depends_on is derived from that")
    dirs: set[str] = set()
    for b in runs.bins:
        dirs |= reached(packages, package_dir(packages, area, binary=b), dev=False)
    for n in runs.benches:
        dirs |= reached(packages, package_dir(packages, area, name=n), dev=True)
    for n in runs.packages:
        dirs |= reached(packages, package_dir(packages, area, name=n), dev=False)
    extra = list(runs.scripts)
    if runs.python:
        dirs |= reached(packages, relative_dir(REPO / Path(PYTHON_MANIFEST).parent), dev=False)
        extra.append(PYTHON_PACKAGE)
    paths = [p for d in sorted(dirs) for p in crate_paths(packages, d)]
    return sorted(set(paths + extra))


def stale_depends_on(results: list[dict]) -> list[tuple[dict, list[str]]]:
    """Each result whose stored depends_on is not the one derived now, with the derived one."""
    packages = cargo_packages()
    wants = ((r, derived_depends_on(r["area"], packages)) for r in results)
    return [(r, want) for r, want in wants if r["depends_on"] != want]


def check_depends_on(results: list[dict]) -> list[str]:
    """Each result whose stored depends_on is not the one derived now, with the difference."""
    out = []
    for r, want in stale_depends_on(results):
        missing = sorted(set(want) - set(r["depends_on"]))
        extra = sorted(set(r["depends_on"]) - set(want))
        out.append(f"bench/results/{r['area']}.json: depends_on is not the derived one "
                   f"(missing {missing}, not reached {extra}): run `bench/results.py derive`")
    return out


def derive(results: list[dict]) -> list[str]:
    """Writes each result's depends_on as derived now; the areas whose list changed."""
    changed = []
    for r, want in stale_depends_on(results):
        r["depends_on"] = want
        write_result(r)
        changed.append(r["area"])
    return changed


def write_result(r: dict) -> Path:
    """`r` as bench/results/AREA.json, in the one layout every writer uses."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{r['area']}.json"
    path.write_text(json.dumps(r, indent=2, ensure_ascii=False) + "\n")
    return path


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


def check_machine(machine, where: str) -> None:
    """A machine says what ran the figures: not empty, and no part of it left blank (a
    description pieced from fields a script failed to read, such as ",  vCPU")."""
    if not isinstance(machine, str) or not all(part.strip() for part in machine.split(",")):
        raise ResultError(f"{where}: machine {machine!r} does not say what ran the figures "
                          "(if it is not known, say 'unknown (not recorded)')")


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
    check_machine(r["machine"], where)
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


def render(results: list[dict], changed: dict[str, list[str]]) -> str:
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


# ---------------------------------------------------------------- generated blocks in the docs

# A block's opening right after a backtick is an example in a code span, not a block.
BLOCK = re.compile(r"(?<!`)<!-- generated:(?P<area>[A-Za-z0-9_]*)(?P<spec>.*?)-->(?P<text>.*?)"
                   r"<!-- end generated -->")
OPENING = "<!-- generated:"
OPENINGS = re.compile(r"(?<!`)<!-- generated:")
BLOCK_KEYS = {"figure", "digits", "unit"}
# Units that follow the value with no space between.
TIGHT_UNITS = {"×", "%"}


def block_spec(spec: str, where: str) -> dict[str, str]:
    try:
        words = shlex.split(spec)
    except ValueError as e:
        raise ResultError(f"{where}: generated block: {e}") from None
    opts = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or key not in BLOCK_KEYS:
            raise ResultError(f"{where}: generated block: {w!r} is not one of "
                              f"{sorted(BLOCK_KEYS)} as KEY=VALUE")
        opts[key] = value
    if "figure" not in opts:
        raise ResultError(f"{where}: generated block names no figure (figure=\"NAME\")")
    if "digits" in opts and not opts["digits"].isdigit():
        raise ResultError(f"{where}: generated block: digits={opts['digits']!r} is not a count")
    return opts


def figures_matching(r: dict, pattern: str) -> list[dict]:
    rx = re.compile("[^,]*".join(re.escape(part) for part in pattern.split("*")) + r"\Z")
    return [f for f in r["figures"] if rx.match(f["name"])]


def block_text(r: dict, stale: bool, opts: dict[str, str], where: str) -> str:
    found = figures_matching(r, opts["figure"])
    if not found:
        raise ResultError(f"{where}: area {r['area']!r} has no figure {opts['figure']!r}")
    units = {f["unit"] for f in found}
    if len(units) > 1 and "unit" not in opts:
        raise ResultError(f"{where}: area {r['area']!r}: figure {opts['figure']!r} matches figures "
                          f"in different units {sorted(units)}")
    digits = opts.get("digits")
    fmt = (lambda v: f"{v:,.{int(digits)}f}") if digits is not None else number
    values = sorted(f["value"] for f in found)
    low, high = fmt(values[0]), fmt(values[-1])
    text = low if low == high else f"{low}–{high}"
    unit = opts.get("unit", units.pop())
    if unit:
        text += unit if unit in TIGHT_UNITS else f" {unit}"
    return text + (" (stale)" if stale else "")


def render_blocks(doc: str, text: str, results: dict[str, dict],
                  changed: dict[str, list[str]]) -> tuple[str, list[str]]:
    """`text` with every generated block rendered again, and what differed: one line per
    block, naming the file and line, the area and the figure."""
    diffs: list[str] = []
    out: list[str] = []
    for n, line in enumerate(text.split("\n"), 1):
        where = f"{doc}:{n}"
        if len(OPENINGS.findall(line)) != len(BLOCK.findall(line)):
            raise ResultError(f"{where}: a generated block without its <!-- end generated --> "
                              "on the same line")

        def one(m: re.Match) -> str:
            area = m["area"]
            if area not in results:
                raise ResultError(f"{where}: generated block names area {area!r}, which "
                                  "bench/results/ does not have")
            opts = block_spec(m["spec"], where)
            want = block_text(results[area], bool(changed[area]), opts, where)
            if m["text"] != want:
                diffs.append(f"{where}: {area} figure {opts['figure']!r} reads {m['text']!r}, "
                             f"the results give {want!r}")
            return f"{OPENING}{area}{m['spec']}-->{want}<!-- end generated -->"

        out.append(BLOCK.sub(one, line))
    return "\n".join(out), diffs


def doc_paths() -> list[Path]:
    return sorted({p for pattern in DOCS for p in REPO.glob(pattern)})


def render_everything(results: list[dict]) -> dict[Path, tuple[str, list[str]]]:
    """Every file `render` writes, with what it would write and how that differs from now."""
    changed = {r["area"]: changed_since(r) for r in results}
    by_area = {r["area"]: r for r in results}
    table = render(results, changed)
    current = OUT.read_text() if OUT.exists() else ""
    files = {OUT: (table, [] if current == table else [
        "bench/RESULTS.md is not what bench/results/*.json and the code now give (a result "
        "changed, or its code did and its figures are now stale)"])}
    for path in doc_paths():
        files[path] = render_blocks(str(path.relative_to(REPO)), path.read_text(), by_area, changed)
    return files


def write_everything(results: list[dict]) -> None:
    for path, (text, diffs) in render_everything(results).items():
        if diffs or path == OUT:
            path.write_text(text)


# ---------------------------------------------------------------- recording


def machine() -> str:
    """This machine: cores, CPU model and memory, from /proc."""
    cpu = platform.processor() or platform.machine() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip() or cpu
                break
        mem = next(int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines()
                   if l.startswith("MemTotal"))
        return f"{os.cpu_count()} vCPU {cpu}, {mem / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError, IndexError):
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
    depends_on = derived_depends_on(a.area, cargo_packages())
    machine_text = machine() if a.machine is None else a.machine
    check_machine(machine_text, f"{a.area}: --machine")
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
        "machine": machine_text,
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
    load(write_result(new))
    write_everything(load_all())
    print(f"bench/results.py: {path.relative_to(REPO)} recorded; bench/RESULTS.md and the "
          "generated blocks rendered")


# ---------------------------------------------------------------- command line


def check() -> int:
    results = load_all()
    problems = check_depends_on(results)
    for path, (_, diffs) in render_everything(results).items():
        problems += diffs
    for p in problems:
        print(f"bench/results.py: {p}", file=sys.stderr)
    if problems:
        print("bench/results.py: run `bench/results.py render` (after `derive`, if a "
              "depends_on is named above) and commit what it writes", file=sys.stderr)
        return 1
    print("bench/results.py: bench/RESULTS.md, the generated blocks and every depends_on are current")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("render", help="write bench/RESULTS.md and the docs' generated blocks")
    sub.add_parser("check", help="fail if render would change anything, or a depends_on is "
                                 "not the derived one")
    sub.add_parser("derive", help="write each result's depends_on as derived from RUNS")
    val = sub.add_parser("validate", help="check a figures file a benchmark wrote")
    val.add_argument("file")
    rec = sub.add_parser("record", help="a benchmark's new result for AREA")
    rec.add_argument("area")
    rec.add_argument("--figures", required=True, help='JSON: {"figures": [...]}')
    rec.add_argument("--command", required=True, help="the command that measured them")
    rec.add_argument("--title")
    rec.add_argument("--machine", help="what ran it (default: this machine, from /proc)")
    rec.add_argument("--notes")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "render":
            write_everything(load_all())
            print("bench/results.py: bench/RESULTS.md and the generated blocks rendered")
        elif a.cmd == "check":
            return check()
        elif a.cmd == "derive":
            changed = derive(load_all())
            print(f"bench/results.py: depends_on derived again for {', '.join(changed) or 'no area'}")
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
