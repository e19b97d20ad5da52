"""bench/results.py, the generator of bench/RESULTS.md and of the figures the docs quote: goals
are met or not by the value alone, bad result files are refused with a message naming the
fault, a result whose code changes after its commit is marked stale until it is measured
again, a doc's generated block follows the result it quotes, and depends_on is what cargo
metadata says the area's command reaches. Runs the script in scratch git repositories of its
own: a small cargo workspace, and a copy of this repository's working tree."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "bench" / "results.py"
GIT_USER = ["-c", "user.name=t", "-c", "user.email=t@t"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *GIT_USER, *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


def results(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(repo / "bench" / "results.py"), *args],
                          capture_output=True, text=True)


def manifest(name: str, bin_name: str = "", deps: tuple[str, ...] = ()) -> str:
    text = f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n'
    if bin_name:
        text += f'\n[[bin]]\nname = "{bin_name}"\npath = "src/main.rs"\n'
    text += "\n[dependencies]\n" + "".join(f'{d} = {{ path = "{p}" }}\n' for d, p in deps)
    return text


# The scratch workspace: the agent (a library), the CLI (the `dquant` binary) and the bench
# harness (`dquant-offload-bench`) both on it, and a crate nothing the fanout area runs reaches.
CRATES = {
    "crates/agent": (manifest("dquant-agent"), "src/lib.rs", "src/share.rs"),
    "crates/cli": (manifest("dquant-cli", "dquant", (("dquant-agent", "../agent"),)), "src/main.rs"),
    "bench/harness": (manifest("dquant-bench", "dquant-offload-bench",
                               (("dquant-agent", "../../crates/agent"),)), "src/main.rs"),
    "crates/other": (manifest("dquant-other"), "src/lib.rs"),
}
# What bench/results.py's RUNS table derives for the fanout area (its binaries: dquant and
# dquant-offload-bench) in that workspace.
FANOUT_DEPENDS = ["bench/common.sh", "bench/harness", "bench/share", "crates/agent", "crates/cli"]


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "bench" / "results").mkdir(parents=True)
    (r / "bench" / "share").mkdir(parents=True)
    shutil.copy(SCRIPT, r / "bench" / "results.py")
    (r / "bench" / "share" / "run.sh").write_text("echo fan-out\n")
    (r / "bench" / "common.sh").write_text("machine_info() { :; }\n")
    (r / "Cargo.toml").write_text('[workspace]\nresolver = "2"\nmembers = ["crates/*", "bench/harness"]\n')
    for d, (toml, *sources) in CRATES.items():
        (r / d / "src").mkdir(parents=True)
        (r / d / "Cargo.toml").write_text(toml)
        for s in sources:
            (r / d / s).write_text("fn main() {}\n" if s.endswith("main.rs") else "pub fn f() {}\n")
    (r / ".gitignore").write_text("target/\nCargo.lock\n")
    git(r, "init", "-q")
    git(r, "commit", "-qm", "x", "--allow-empty")
    commit_all(r, "code")
    return r


def area(repo: Path, figures: list[dict], **over) -> Path:
    doc = {"area": "fanout", "title": "Fan-out", "command": "bench/share/run.sh",
           "commit": git(repo, "rev-parse", "HEAD"), "date": "2026-11-25",
           "machine": "2 vCPU", "depends_on": FANOUT_DEPENDS, "figures": figures, **over}
    p = repo / "bench" / "results" / "fanout.json"
    p.write_text(json.dumps(doc))
    return p


FIGS = [
    {"name": "cpu", "value": 2.64, "unit": "×", "baseline": "lone", "goal": "<= 1.2"},
    {"name": "read", "value": 1.0, "unit": "×", "baseline": "lone", "goal": "<= 1.2"},
    {"name": "rate", "value": 0.31, "unit": "×", "baseline": "lone", "goal": None},
]


def test_goals_are_judged_from_the_value_and_the_table_is_current(repo):
    area(repo, FIGS)
    assert results(repo, "render").returncode == 0
    text = (repo / "bench" / "RESULTS.md").read_text()
    assert "| cpu | 2.64 × | lone | <= 1.2 | ❌ |" in text
    assert "| read | 1 × | lone | <= 1.2 | ✅ |" in text
    assert "| rate | 0.31 × | lone |  |  |" in text
    assert "| [fanout](#fan-out) | 3 | 1 of 2 |" in text and "| current |" in text
    c = results(repo, "check")
    assert c.returncode == 0, c.stderr


def test_notes_in_paragraphs_render_as_one_bullet_each(repo):
    area(repo, FIGS, notes="Why it is slow.\n\nWhat was tried.\n\n")
    assert results(repo, "render").returncode == 0
    text = (repo / "bench" / "RESULTS.md").read_text()
    assert "- Why it is slow.\n- What was tried.\n\n| figure |" in text


def test_a_change_to_measured_code_makes_the_area_stale_until_rendered(repo):
    area(repo, FIGS)
    results(repo, "render")
    (repo / "crates" / "other" / "src" / "lib.rs").write_text("pub fn f() { 1; }\n")
    assert results(repo, "check").returncode == 0, "a crate its binaries do not reach"
    (repo / "crates" / "agent" / "src" / "new.rs").write_text("fn new() {}\n")
    assert results(repo, "check").returncode == 1, "a new file under its paths, not yet tracked"
    (repo / "crates" / "agent" / "src" / "new.rs").unlink()
    (repo / "crates" / "agent" / "src" / "share.rs").write_text("pub fn f() { 2; }\n")
    c = results(repo, "check")
    assert c.returncode == 1 and "bench/RESULTS.md is not what bench/results/*.json" in c.stderr
    results(repo, "render")
    text = (repo / "bench" / "RESULTS.md").read_text()
    assert "**Stale**: changed since" in text and "`crates/agent/src/share.rs`" in text
    assert "| cpu | ~~2.64 ×~~ | lone | <= 1.2 | stale |" in text
    assert results(repo, "check").returncode == 0


@pytest.mark.parametrize(
    "over, figures, message",
    [
        ({}, [{**FIGS[0], "goal": "at most 1.2"}],
         "bench/results/fanout.json: figure 'cpu': goal 'at most 1.2': starts with <=, >=, < or >, then a space"),
        ({}, [{**FIGS[0], "value": "2.64"}],
         "bench/results/fanout.json: figure 'cpu': value '2.64' is not a number"),
        ({"depends_on": ["crates/gone"]}, FIGS,
         "bench/results/fanout.json: depends_on 'crates/gone' does not exist (renamed? update it)"),
        ({"depends_on": ["bench"]}, FIGS,
         "bench/results/fanout.json: depends_on 'bench' holds the results themselves; name the code"),
        ({"commit": "0" * 40}, FIGS,
         f"bench/results/fanout.json: commit {'0' * 40} is not in this clone's history "
         "(a shallow clone? `git fetch --unshallow`)"),
        ({"area": "fan"}, FIGS, "bench/results/fanout.json: area 'fan' is not the file's name"),
        ({"machine": ""}, FIGS,
         "bench/results/fanout.json: machine '' does not say what ran the figures "
         "(if it is not known, say 'unknown (not recorded)')"),
        ({"machine": ",  vCPU"}, FIGS,
         "bench/results/fanout.json: machine ',  vCPU' does not say what ran the figures "
         "(if it is not known, say 'unknown (not recorded)')"),
    ],
)
def test_bad_results_are_refused_with_the_fault_named(repo, over, figures, message):
    area(repo, figures, **over)
    r = results(repo, "render")
    assert r.returncode == 1
    assert r.stderr.strip() == f"bench/results.py: {message}"


def test_record_fills_in_commit_depends_on_and_machine_and_keeps_the_old_result(repo):
    old = area(repo, FIGS, depends_on=["crates/agent"])
    commit_all(repo, "result")
    new = repo / "new.json"
    new.write_text(json.dumps({"figures": [{**FIGS[0], "value": 1.1}]}))
    r = results(repo, "record", "fanout", "--figures", str(new), "--command", "bench/share/run.sh")
    assert r.returncode == 0, r.stderr
    rec = json.loads(old.read_text())
    assert rec["commit"] == git(repo, "rev-parse", "HEAD") and rec["figures"][0]["value"] == 1.1
    assert rec["title"] == "Fan-out" and rec["depends_on"] == FANOUT_DEPENDS
    cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
               if line.startswith("model name"))
    assert re.fullmatch(rf"\d+ vCPU {re.escape(cpu)}, \d+ GiB", rec["machine"]), rec["machine"]
    hist = (repo / "bench" / "history" / "fanout.jsonl").read_text().splitlines()
    assert [json.loads(h)["figures"][0]["value"] for h in hist] == [2.64]
    assert "| cpu | 1.1 × | lone | <= 1.2 | ✅ |" in (repo / "bench" / "RESULTS.md").read_text()
    # A machine description pieced from fields a script failed to read.
    r = results(repo, "record", "fanout", "--figures", str(new), "--command", "x", "--machine", ",  vCPU")
    assert r.returncode == 1 and "machine ',  vCPU' does not say what ran the figures" in r.stderr
    # Uncommitted changes under its paths: no commit would name what was measured.
    (repo / "crates" / "agent" / "src" / "share.rs").write_text("pub fn f() { 3; }\n")
    r = results(repo, "record", "fanout", "--figures", str(new), "--command", "x")
    assert r.returncode == 1 and "uncommitted changes under its depends_on" in r.stderr


def test_an_area_not_in_runs_cannot_be_recorded(repo):
    new = repo / "new.json"
    new.write_text(json.dumps({"figures": FIGS}))
    r = results(repo, "record", "warp", "--figures", str(new), "--command", "x")
    assert r.returncode == 1
    assert r.stderr.strip() == ("bench/results.py: warp: not in RUNS (bench/results.py): say there "
                                "what its command runs, and its depends_on is derived from that")


def test_a_depends_on_listed_by_hand_fails_check_until_derived(repo):
    p = area(repo, FIGS, depends_on=["bench/share", "crates/agent", "crates/other"])
    results(repo, "render")
    c = results(repo, "check")
    assert c.returncode == 1
    assert ("bench/results.py: bench/results/fanout.json: depends_on is not the derived one "
            "(missing ['bench/common.sh', 'bench/harness', 'crates/cli'], not reached "
            "['crates/other']): run `bench/results.py derive`") in c.stderr
    d = results(repo, "derive")
    assert d.returncode == 0 and "derived again for fanout" in d.stdout
    assert json.loads(p.read_text())["depends_on"] == FANOUT_DEPENDS
    results(repo, "render")
    assert results(repo, "check").returncode == 0


def block(spec: str, text: str = "") -> str:
    return f"<!-- generated:fanout {spec} -->{text}<!-- end generated -->"


README = f"""# Scratch

| row | figure |
|---|---|
| one | {block('figure="cpu"')} |
| range | {block('figure="r*" digits=2')} over runs |
| count | {block('figure="configs" unit=configs')} |
| bare | {block('figure="rate" digits=1 unit=""')} |
"""


def test_a_changed_figure_fails_check_until_render_carries_it_into_the_readme(repo):
    # `*` stays within one comma-separated part of a name: "r*" is not "rate, shuffled".
    figs = FIGS + [{"name": "configs", "value": 57, "unit": "", "baseline": "", "goal": None},
                   {"name": "rate, shuffled", "value": 9.5, "unit": "×", "baseline": "", "goal": None}]
    p = area(repo, figs)
    (repo / "README.md").write_text(README)
    (repo / "docs").mkdir()
    (repo / "docs" / "guide.md").write_text(f"Fan-out costs {block('figure=cpu digits=1')}.\n")
    assert results(repo, "render").returncode == 0
    readme = (repo / "README.md").read_text()
    assert "| one | " + block('figure="cpu"', "2.64×") + " |" in readme
    assert "| range | " + block('figure="r*" digits=2', "0.31–1.00×") + " over runs |" in readme
    assert "| count | " + block('figure="configs" unit=configs', "57 configs") + " |" in readme
    assert "| bare | " + block('figure="rate" digits=1 unit=""', "0.3") + " |" in readme
    guide = repo / "docs" / "guide.md"
    assert guide.read_text() == f"Fan-out costs {block('figure=cpu digits=1', '2.6×')}.\n"
    # In a code span, the syntax is an example: left as it is, checked by nothing.
    example = "Write `" + block('figure="NAME"', "…") + "` to quote a figure.\n"
    (repo / "docs" / "how.md").write_text(example)
    assert results(repo, "check").returncode == 0

    doc = json.loads(p.read_text())
    doc["figures"][0]["value"] = 6.27
    p.write_text(json.dumps(doc))
    c = results(repo, "check")
    assert c.returncode == 1
    assert "bench/results.py: README.md:5: fanout figure 'cpu' reads '2.64×', the results give '6.27×'" in c.stderr
    assert "bench/results.py: docs/guide.md:1: fanout figure 'cpu' reads '2.6×', the results give '6.3×'" in c.stderr
    assert results(repo, "render").returncode == 0
    assert "| one | " + block('figure="cpu"', "6.27×") + " |" in (repo / "README.md").read_text()
    assert guide.read_text() == f"Fan-out costs {block('figure=cpu digits=1', '6.3×')}.\n"
    assert (repo / "docs" / "how.md").read_text() == example
    assert results(repo, "check").returncode == 0

    # The area's code changes: every figure quoted from it says so.
    commit_all(repo, "docs")
    (repo / "crates" / "cli" / "src" / "main.rs").write_text("fn main() { 1; }\n")
    assert results(repo, "check").returncode == 1
    results(repo, "render")
    assert guide.read_text() == f"Fan-out costs {block('figure=cpu digits=1', '6.3× (stale)')}.\n"


@pytest.mark.parametrize(
    "line, message",
    [
        ("<!-- generated:warp figure=cpu -->1<!-- end generated -->",
         "README.md:1: generated block names area 'warp', which bench/results/ does not have"),
        (block('figure="cpu share"'), "README.md:1: area 'fanout' has no figure 'cpu share'"),
        (block("digits=2"), 'README.md:1: generated block names no figure (figure="NAME")'),
        (block("figure=cpu places=2"),
         "README.md:1: generated block: 'places=2' is not one of ['digits', 'figure', 'unit'] as KEY=VALUE"),
        ("<!-- generated:fanout figure=cpu -->1", "README.md:1: a generated block without its "
         "<!-- end generated --> on the same line"),
    ],
)
def test_a_block_naming_what_does_not_exist_is_refused(repo, line, message):
    area(repo, FIGS)
    (repo / "README.md").write_text(line + "\n")
    for cmd in ("check", "render"):
        r = results(repo, cmd)
        assert r.returncode == 1 and r.stderr.strip() == f"bench/results.py: {message}"


def copy_of_this_repository(dest: Path) -> Path:
    """This repository's working tree (tracked and untracked, not ignored) in a git repository
    of its own, every result recorded at its first commit: all current."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], check=True, capture_output=True).stdout
    for name in files.decode().split("\0"):
        src = REPO / name
        if name and src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    git(dest, "init", "-q")
    commit_all(dest, "copy")
    head = git(dest, "rev-parse", "HEAD")
    for p in (dest / "bench" / "results").glob("*.json"):
        doc = json.loads(p.read_text())
        doc["commit"] = head
        p.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    assert results(dest, "render").returncode == 0
    commit_all(dest, "results at the copy")
    return dest


def statuses(repo: Path) -> dict[str, str]:
    r = results(repo, "render")
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^\| \[(\w+)\]\(#[^)]*\) \|.*\| (current|stale) \|$",
                      (repo / "bench" / "RESULTS.md").read_text(), re.M)
    return dict(rows)


def areas_depending_on(repo: Path, path: str) -> set[str]:
    return {p.stem for p in (repo / "bench" / "results").glob("*.json")
            if path in json.loads(p.read_text())["depends_on"]}


def test_a_change_in_dquant_storage_stales_every_area_that_reads_through_it(tmp_path):
    repo = copy_of_this_repository(tmp_path / "copy")
    c = results(repo, "check")
    assert c.returncode == 0, c.stderr
    before = statuses(repo)
    assert len(before) >= 20 and set(before.values()) == {"current"}

    # The bench harness: the areas that run dquant-offload-bench go stale, those that run
    # only the dquant binary, the Python extension or the fuzz targets stay current.
    with open(repo / "bench" / "harness" / "src" / "main.rs", "a") as f:
        f.write("// a change in the harness\n")
    commit_all(repo, "harness")
    after = statuses(repo)
    harness = areas_depending_on(repo, "bench/harness")
    assert {a for a, s in after.items() if s == "stale"} == harness
    assert {"megatron", "mount", "python_loaders", "fuzz", "codecs"} <= set(after) - harness
    assert {"fanout", "cost", "lab", "offload"} <= harness

    # dquant-storage: every area whose binaries or extension read through it.
    with open(repo / "crates" / "dquant-storage" / "src" / "lib.rs", "a") as f:
        f.write("// a change in the storage layer\n")
    commit_all(repo, "storage")
    storage = areas_depending_on(repo, "crates/dquant-storage")
    assert {"megatron", "mount", "python_loaders", "fuzz", "codecs"} <= storage
    assert {a for a, s in statuses(repo).items() if s == "stale"} == storage | harness
