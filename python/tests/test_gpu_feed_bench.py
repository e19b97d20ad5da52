"""bench/gpu/feed.py, the batches-into-GPU-memory benchmark, on the CPU (``--device cpu``):
CI has no GPU, so this checks its wiring, that its digest check fails on other samples, and
that its figures fit bench/results.py's schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, dquant_bin

FEED = REPO / "bench" / "gpu" / "feed.py"
FIGURES = REPO / "bench" / "gpu" / "figures.py"


def test_every_row_puts_the_corpus_samples_in_device_memory_and_its_figures_fit(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, str(FEED), "--out", str(out), "--device", "cpu", "--tokens", "300000",
         "--runs", "1", "--min-run-s", "0.05", "--workers", "1", "--dquant-bin", str(dquant_bin())],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "results.json").read_text())
    rows = [row["row"] for row in doc["rows"]]
    assert rows == [
        "limit: pinned batches copied to the GPU",
        "in-process, dquant DataLoader (no workers, no pin)",
        "in-process, dquant DataLoader (no workers, pin_memory)",
        "in-process, dquant DataLoader (no workers), staged in 3 reused pinned buffers",
        "in-process, dquant DataLoader (no workers, device='cpu')",
        "dquant DataLoader, 1 worker(s), device='cpu'",
        "dquant DataLoader, 1 worker(s), pin_memory",
        "agent over shm, dquant DataLoader, 0 session(s), device='cpu'",
        "agent over shm, dquant DataLoader, 1 session(s), device='cpu'",
        "agent over shm, dquant DataLoader, 0 session(s), pin_memory",
        "agent over shm, dquant DataLoader, 1 session(s), pin_memory",
        "torch DataLoader + TokenDataset, 1 worker(s), pin_memory",
    ]
    assert all(row["tokens_s"] > 0 and row["passes"] >= 1 for row in doc["rows"])
    figures = tmp_path / "figures.json"
    subprocess.run([sys.executable, str(FIGURES), str(out / "results.json"), str(figures)],
                   check=True)
    v = subprocess.run([sys.executable, str(REPO / "bench" / "results.py"), "validate",
                        str(figures)], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr
    names = [f["name"] for f in json.loads(figures.read_text())["figures"]]
    assert len(names) == 10 and names[0].startswith("in-process (no workers, pin_memory)")


def test_a_pass_with_other_samples_fails_the_run(tmp_path):
    sys.path.insert(0, str(FEED.parent))
    try:
        import feed
    finally:
        sys.path.pop(0)
    a = feed.parse_args(["--out", str(tmp_path), "--device", "cpu", "--seq-len", "4",
                         "--batch-size", "2"])
    tokens = torch.arange(20, dtype=torch.int64).reshape(2, 10)
    good = {"input_ids": tokens[:, :4], "labels": tokens[:, 1:5]}
    digest = feed.Digest(4, "cpu")
    feed.checked(feed.Row("good", lambda: iter([good])), a, digest, None)
    want = digest.w.mul(good["input_ids"]).sum() + digest.w.mul(good["labels"]).sum()
    feed.checked(feed.Row("good", lambda: iter([good])), a, digest, int(want))
    bad = {"input_ids": good["input_ids"].clone(), "labels": good["labels"]}
    bad["input_ids"][1, 3] += 1
    with pytest.raises(SystemExit, match=r"^bad: its pass put other samples in GPU memory"):
        feed.checked(feed.Row("bad", lambda: iter([bad])), a, digest, int(want))
