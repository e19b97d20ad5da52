"""The examples in README.md and docs/ run: every fenced block marked `bash` or `python` is
executed, the blocks of a page in order in one fresh directory (a page is a walk-through: a
later block may use a file an earlier one wrote) holding the Megatron fixtures as `data/`, with
the `dquant` under test first on PATH. docs/README.md states the convention."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO, dquant_bin, require

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = {"bash", "python"}
NOT_RUN_MARKS = {"cluster", "ci"}
# Shell blocks that are neither run nor marked (`sh`): none. Every shell example runs
# (`bash`) or says why it cannot here (`bash cluster`).
MAX_UNCONVERTED = 0
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)


def blocks():
    """(page, line, language, marks, code) of every fenced block."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            words = m.group(1).split()
            lang, marks = (words[0] if words else ""), set(words[1:])
            line = text.count("\n", 0, m.start()) + 1
            out.append((page, line, lang, marks, m.group(2)))
    return out


def runnable():
    return [b for b in blocks() if b[2] in RUN and not b[3]]


def test_every_shell_and_python_block_is_run_or_marked():
    unknown = [
        f"{p.relative_to(REPO)}:{line}: {lang} {' '.join(sorted(marks))}"
        for p, line, lang, marks, _ in blocks()
        if lang in RUN and marks and not marks <= NOT_RUN_MARKS
    ]
    assert not unknown, f"unknown marks (docs/README.md lists them): {unknown}"
    readme_sh = [f"README.md:{line}" for p, line, lang, _, _ in blocks() if p.name == "README.md" and p.parent == REPO and lang in ("sh", "shell", "console")]
    assert not readme_sh, f"README.md examples must run (bash) or be marked: {readme_sh}"
    unconverted = [b for b in blocks() if b[2] in ("sh", "shell")]
    assert len(unconverted) <= MAX_UNCONVERTED, (
        f"{len(unconverted)} `sh` examples in the guides, more than {MAX_UNCONVERTED}: "
        "write new examples as runnable `bash` blocks"
    )
    assert len(runnable()) >= 8


@pytest.fixture(scope="module")
def page_dirs() -> dict:
    """Each page's working directory, shared by its blocks."""
    return {}


def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    shutil.copytree(FIXTURES, d / "data", ignore=shutil.ignore_patterns("*.py", "*.md"))
    (d / "examples").symlink_to(REPO / "examples")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "dquant").symlink_to(dquant_bin().resolve())
    # `python` in a bash example is the Python the docs are tested with (the test venv's).
    # (A wrapper, not a link: a venv's python finds its venv by the path it was started as.)
    wrapper = bindir / "python"
    wrapper.write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return d


def run_block(lang: str, code: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{cwd.parent / 'bin'}:{os.environ['PATH']}", "DQUANT_LOG": "warn"}
    if lang == "bash":
        code = code.replace("cargo run --release --", "dquant")
        argv = ["bash", "-euo", "pipefail", "-c", code]
    else:
        argv = [sys.executable, "-c", code]
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        # Whatever the block left running in the background (an agent) goes with it.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, p.returncode, out, None)


@pytest.mark.parametrize(
    "page,line,lang,code",
    [(p, line, lang, code) for p, line, lang, _, code in runnable()],
    ids=[f"{p.relative_to(REPO)}:{line}" for p, line, _, _, _ in runnable()],
)
def test_example_runs(page, line, lang, code, page_dirs, tmp_path_factory):
    if "dquant mount" in code:
        fuse, root = os.path.exists("/dev/fuse"), os.geteuid() == 0
        require("FUSE", fuse and root, f"the example mounts; /dev/fuse: {fuse}, root: {root}")
    if page not in page_dirs:
        page_dirs[page] = workdir(tmp_path_factory.mktemp(page.stem))
    r = run_block(lang, code, page_dirs[page])
    where = f"{page.relative_to(REPO)}:{line}"
    assert r.returncode == 0, f"{where} failed ({r.returncode}):\n{code}\n--- output ---\n{r.stdout[-4000:]}"


LINK = re.compile(r"\]\(([^)\s#]+)(#[^)]*)?\)")


def test_every_relative_link_resolves():
    """A moved or renamed file breaks the page that links to it here, not in a reader's hands."""
    broken = []
    for page in PAGES:
        for m in LINK.finditer(page.read_text()):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, f"links to nothing: {broken}"
