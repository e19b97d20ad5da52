"""Shared fixtures: the Megatron-Core fixture datasets, a second dataset with disjoint token
ids (so a blended sample tells which source it came from), and a real `dquant serve` agent
on loopback and a Unix socket."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

# Raw files' document-index cache entries (DQUANT_CACHE_DIR) go to a directory of this run,
# removed at its end, not to ~/.cache/dquant; the agents the tests start inherit it.
_CACHE = tempfile.mkdtemp(prefix="dquant-test-cache-")
os.environ.setdefault("DQUANT_CACHE_DIR", _CACHE)
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "testkit" / "fixtures" / "megatron"
# Token ids of the shifted copy start here: above every r50k id.
SHIFT = 50_257


def dquant_bin() -> Path:
    env = os.environ.get("DQUANT_BIN")
    if env:
        return Path(env)
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / "dquant"
        if p.exists():
            return p
    raise RuntimeError("no dquant binary: run `cargo build -p dquant-cli` (python/test.sh does)")


def require(component: str, present: bool, how: str) -> None:
    """Fails the test under CI=true when `component` (FUSE, a namespace, a server) is
    missing, since CI installs all of them and a test that checked nothing must not pass;
    elsewhere skips it, saying why (python/test.sh runs pytest with -rs, so the reason is in
    the summary), and appends a line to $DQUANT_SKIP_LOG when it is set, as the Rust tests'
    `dquant_testkit::require` does, for `.ci/run` to count."""
    if present:
        return
    if os.environ.get("CI") in ("true", "1"):
        pytest.fail(f"{component} is missing and CI=true: nothing can be checked ({how})")
    log = os.environ.get("DQUANT_SKIP_LOG")
    if log:
        test = os.environ.get("PYTEST_CURRENT_TEST", "a test").split(" ")[0]
        with open(log, "a") as f:
            f.write(f"SKIPPED {test}: {component} is missing ({how})\n")
    pytest.skip(f"*** {component} is missing ({how}) ***")


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> Path:
    """A directory with the Megatron fixtures (`r50k_int32`, `r50k_uint16`) and `shifted`,
    a raw int32 file of the same tokens plus SHIFT, in reverse order."""
    if not FIXTURES.is_dir():
        pytest.fail(f"{FIXTURES} is missing: the Megatron fixtures are part of the repository")
    d = tmp_path_factory.mktemp("data")
    for name in ("r50k_int32", "r50k_uint16"):
        for ext in ("bin", "idx"):
            shutil.copy(FIXTURES / f"{name}.{ext}", d / f"{name}.{ext}")
    tokens = np.fromfile(FIXTURES / "r50k_int32.bin", dtype=np.int32)
    (tokens[::-1] + SHIFT).astype(np.int32).tofile(d / "shifted.i32")
    return d


@pytest.fixture(scope="session")
def tokens() -> np.ndarray:
    return np.fromfile(FIXTURES / "r50k_int32.bin", dtype=np.int32)


class Agent:
    """A `dquant serve` process; `uri` is its TCP address, `socket` its Unix socket."""

    def __init__(self, root: Path, sock: Path) -> None:
        self.proc = subprocess.Popen(
            [
                str(dquant_bin()),
                "serve",
                "--root",
                f"data={root}",
                "--listen",
                "127.0.0.1:0",
                "--data-listen",
                "127.0.0.1:0",
                "--socket",
                str(sock),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "DQUANT_LOG": "warn"},
        )
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"listening: uri=(\S+)", line)
            if m:
                self.uri = m.group(1)
                self.socket = str(sock)
                return
        self.stop()
        raise RuntimeError(f"dquant serve did not start: {line!r}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def agent(data, tmp_path_factory):
    a = Agent(data, tmp_path_factory.mktemp("sock") / "agent.sock")
    yield a
    a.stop()


@pytest.fixture
def fresh_agent(data, tmp_path):
    """An agent of its own, for tests that kill it."""
    a = Agent(data, tmp_path / "agent.sock")
    yield a
    a.stop()


def plan(data: Path, *sources, seq_len=127, batch_size=4, **fields) -> dict:
    """A plan over `sources` ((name, weight) or name, relative to `data`), local paths."""
    srcs = []
    for s in sources or ("r50k_int32",):
        name, weight = (s, 1.0) if isinstance(s, str) else s
        src = {"uri": str(data / name), "weight": weight}
        if name.endswith(".i32"):
            src["dtype"] = "int32"
        srcs.append(src)
    return {"sources": srcs, "seq_len": seq_len, "batch_size": batch_size, **fields}


def on_agent(p: dict, data: Path) -> dict:
    """`p` with its sources named as datasets of the agent's `data` root."""
    q = dict(p)
    q["sources"] = [
        {**s, "uri": "data/" + os.path.relpath(s["uri"], data)} for s in p["sources"]
    ]
    return q


def stream(reader) -> bytes:
    return b"".join(a.tobytes() for a in reader)


sys.path.insert(0, str(Path(__file__).parent))


def cloned(batches) -> list[dict]:
    """Each batch (a dict of tensors) of `batches`, copied: a loader may reuse its memory."""
    return [{k: v.clone() for k, v in b.items()} for b in batches]


def assert_same_batches(a: list[dict], b: list[dict]) -> None:
    """Two streams of batches are equal batch for batch and key for key, dtypes included."""
    import torch

    assert len(a) == len(b) > 0
    for i, (x, y) in enumerate(zip(a, b)):
        assert sorted(x) == sorted(y), i
        for k in x:
            assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), (i, k)
