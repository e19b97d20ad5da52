"""The vendored Megatron-Core fixtures are what Megatron-Core writes: regenerate.py tokenizes
the same text and writes it with Megatron's own IndexedDatasetBuilder, and every file matches
the vendored one byte for byte."""

import os
import subprocess
import sys

from conftest import FIXTURES, dquant_bin, require


def test_the_vendored_fixtures_are_what_megatron_writes():
    # The text is this CPython's `email` package; the vendored files come from 3.11.7's.
    version = ".".join(map(str, sys.version_info[:3]))
    require("CPython 3.11.7 (the fixtures' source text)", version == "3.11.7", f"this is {version}")
    out = subprocess.run(
        [sys.executable, str(FIXTURES / "regenerate.py"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "DQUANT_BIN": str(dquant_bin())},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("28 documents, 161032 tokens: all 6 files match"), out.stdout
