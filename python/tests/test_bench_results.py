"""bench/results.py, the generator of bench/RESULTS.md: goals are met or not by the value
alone, bad result files are refused with a message naming the fault, and a result whose code
changes after its commit is marked stale until it is measured again. Runs the script in a
scratch git repository of its own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "bench" / "results.py"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def results(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(repo / "bench" / "results.py"), *args],
                          capture_output=True, text=True)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "bench" / "results").mkdir(parents=True)
    (r / "crates" / "agent").mkdir(parents=True)
    shutil.copy(SCRIPT, r / "bench" / "results.py")
    (r / "crates" / "agent" / "share.rs").write_text("fn share() {}\n")
    (r / "crates" / "other.rs").write_text("fn other() {}\n")
    git(r, "init", "-q")
    git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "x", "--allow-empty")
    git(r, "add", "-A")
    git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    return r


def area(repo: Path, figures: list[dict], **over) -> Path:
    doc = {"area": "fanout", "title": "Fan-out", "command": "bench/share/run.sh",
           "commit": git(repo, "rev-parse", "HEAD"), "date": "2026-11-25",
           "machine": "2 vCPU", "depends_on": ["crates/agent"], "figures": figures, **over}
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
    assert results(repo, "check").returncode == 0


def test_notes_in_paragraphs_render_as_one_bullet_each(repo):
    area(repo, FIGS, notes="Why it is slow.\n\nWhat was tried.\n\n")
    assert results(repo, "render").returncode == 0
    text = (repo / "bench" / "RESULTS.md").read_text()
    assert "- Why it is slow.\n- What was tried.\n\n| figure |" in text


def test_a_change_to_measured_code_makes_the_area_stale_until_rendered(repo):
    area(repo, FIGS)
    results(repo, "render")
    (repo / "crates" / "other.rs").write_text("fn other() { 1; }\n")
    assert results(repo, "check").returncode == 0, "a path it does not depend on"
    (repo / "crates" / "agent" / "new.rs").write_text("fn new() {}\n")
    assert results(repo, "check").returncode == 1, "a new file under its paths, not yet tracked"
    (repo / "crates" / "agent" / "new.rs").unlink()
    (repo / "crates" / "agent" / "share.rs").write_text("fn share() { 2; }\n")
    c = results(repo, "check")
    assert c.returncode == 1 and "is not what bench/results/*.json" in c.stderr
    results(repo, "render")
    text = (repo / "bench" / "RESULTS.md").read_text()
    assert "**Stale**: changed since" in text and "`crates/agent/share.rs`" in text
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
    ],
)
def test_bad_results_are_refused_with_the_fault_named(repo, over, figures, message):
    area(repo, figures, **over)
    r = results(repo, "render")
    assert r.returncode == 1
    assert r.stderr.strip() == f"bench/results.py: {message}"


def test_record_fills_in_the_commit_and_keeps_the_old_result_in_history(repo):
    old = area(repo, FIGS)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "result")
    new = repo / "new.json"
    new.write_text(json.dumps({"figures": [{**FIGS[0], "value": 1.1}]}))
    r = results(repo, "record", "fanout", "--figures", str(new), "--command", "bench/share/run.sh")
    assert r.returncode == 0, r.stderr
    rec = json.loads(old.read_text())
    assert rec["commit"] == git(repo, "rev-parse", "HEAD") and rec["figures"][0]["value"] == 1.1
    assert rec["title"] == "Fan-out" and rec["depends_on"] == ["crates/agent"]
    hist = (repo / "bench" / "history" / "fanout.jsonl").read_text().splitlines()
    assert [json.loads(h)["figures"][0]["value"] for h in hist] == [2.64]
    assert "| cpu | 1.1 × | lone | <= 1.2 | ✅ |" in (repo / "bench" / "RESULTS.md").read_text()
    # Uncommitted changes under its paths: no commit would name what was measured.
    (repo / "crates" / "agent" / "share.rs").write_text("fn share() { 3; }\n")
    r = results(repo, "record", "fanout", "--figures", str(new), "--command", "x")
    assert r.returncode == 1 and "uncommitted changes under its depends_on" in r.stderr
