"""fuzz/figures.py: a campaign log becomes a kept summary (fuzz/runs/), and the fuzz area's
figures come from the newest summary of each target, never from a log; a target without a
summary, or a run that did not finish, is refused."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "fuzz"))
import figures as fz  # noqa: E402

LOG = """== fuzz campaign: hello (5000 runs) 2026-11-29T13:30:00Z
INFO: Seed: 123
#2\tINITED cov: 100 ft: 120 corp: 5/100b exec/s: 0 rss: 30Mb
#5000\tDONE   cov: 324 ft: 410 corp: 116/3000b lim: 43 exec/s: 2500 rss: 41Mb
Test unit written to artifacts/hello/timeout-abc
Done 5000 runs in 2 second(s)
stat::number_of_executed_units: 5000
stat::average_exec_per_sec:     2500
stat::peak_rss_mb:              41
"""


def campaign(tmp: Path, log: str = LOG) -> tuple[Path, Path]:
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "b").write_bytes(b"bb")
    (tmp / "corpus" / "a").write_bytes(b"a")
    (tmp / "hello.log").write_text(log)
    return tmp / "hello.log", tmp / "corpus"


def test_a_summary_keeps_the_final_stats_the_written_inputs_and_the_corpus(tmp_path):
    log, corpus = campaign(tmp_path)
    path = fz.summarize("hello", log, 5000, corpus, tmp_path / "runs")
    s = json.loads(path.read_text())
    assert path.name.endswith("-hello.json") and path.parent == tmp_path / "runs"
    want = hashlib.sha256(b"a\0" + hashlib.sha256(b"a").digest()
                          + b"b\0" + hashlib.sha256(b"bb").digest()).hexdigest()
    assert s["corpus"] == {"inputs": 2, "bytes": 3, "sha256": want}
    assert s["executions"] == 5000 and s["runs_asked"] == 5000
    assert s["final_stats"] == {"number_of_executed_units": 5000, "average_exec_per_sec": 2500,
                                "peak_rss_mb": 41}
    assert s["written"] == ["artifacts/hello/timeout-abc"]
    assert s["done_line"] == "Done 5000 runs in 2 second(s)"
    assert s["status_line"].startswith("#5000\tDONE   cov: 324")
    assert len(s["commit"]) == 40 and s["machine"]


def test_figures_come_from_the_newest_summary_of_each_target(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    base = {"target": "hello", "runs_asked": 5000, "machine": "m", "written": [],
            "corpus": {"inputs": 7, "bytes": 9, "sha256": "f" * 64},
            "final_stats": {"average_exec_per_sec": 1234},
            "status_line": "#5000\tDONE   cov: 324 ft: 1 corp: 7/9b", "done_line":
            "Done 5000 runs in 4 second(s)"}
    (runs / "20261128T100000Z-hello.json").write_text(json.dumps({**base, "executions": 1}))
    (runs / "20261129T100000Z-hello.json").write_text(json.dumps(
        {**base, "executions": 5000, "written": ["crash-1"]}))
    (runs / "20261130T100000Z-hello.json").write_text(json.dumps(
        {**base, "runs_asked": 10, "executions": 10}))
    figs = fz.figures(fz.latest(5000, ["hello"], runs), 5000)
    assert figs == [
        {"name": "`hello`: executions", "value": 5000, "unit": "", "goal": ">= 5000",
         "baseline": "324 edges, corpus 7 inputs (sha256 ffffffffffff), 1,234 exec/s over 4 s; "
                     "fuzz/runs/20261129T100000Z-hello.json"},
        {"name": "`hello`: crashes, hangs, OOMs", "value": 1, "unit": "", "goal": "<= 0",
         "baseline": "inputs libFuzzer wrote to fuzz/artifacts"}]
    assert fz.one_machine(fz.latest(5000, ["hello"], runs)) == "m"
    with pytest.raises(fz.FuzzError, match="^no summary of a 5000-run campaign in .* for "
                                           "plan_json$"):
        fz.latest(5000, ["hello", "plan_json"], runs)


def test_an_unfinished_run_or_another_run_count_is_refused(tmp_path):
    log, corpus = campaign(tmp_path, LOG.split("Done")[0])
    with pytest.raises(fz.FuzzError, match="hello: no final stats"):
        fz.summarize("hello", log, 5000, corpus, tmp_path / "runs")
    log.write_text(LOG)
    with pytest.raises(fz.FuzzError, match="hello was asked 5000 runs, not 10$"):
        fz.summarize("hello", log, 10, corpus, tmp_path / "runs")
    assert not (tmp_path / "runs").exists()
