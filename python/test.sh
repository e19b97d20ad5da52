#!/usr/bin/env bash
# Builds the dquant Python package into a venv and runs its pytest suite.
#
# The venv lives at $DQUANT_VENV, default ~/.cache/dquant/venv-test-<hash of
# requirements-test.txt>, so it is created once and reused until the requirements change
# (torch alone is several GB). Extra arguments go to pytest (e.g. -k resume -x);
# `--no-tests` only builds, then prints the venv's python.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
req="$here/requirements-test.txt"
hash=$(sha256sum "$req" | cut -c1-12)
venv="${DQUANT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dquant/venv-test-$hash}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.requirements-done" ]; then
  echo "== python venv: creating $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
  # --no-cache-dir: the torch wheel and its CUDA libraries would otherwise sit in pip's
  # cache as well as in the venv, several GB more on disk for a venv that is made once.
  "$venv/bin/python" -m pip install --quiet --no-cache-dir --upgrade pip
  "$venv/bin/python" -m pip install --quiet --no-cache-dir -r "$req"
  touch "$venv/.requirements-done"
else
  echo "== python venv: reusing $venv"
fi

echo "== python package: maturin develop --release"
# `maturin develop` installs the extension and the pure-Python modules into the venv.
(cd "$here" && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" \
  "$venv/bin/maturin" develop --release --locked --quiet)

# The tests start real agents: the `dquant` binary, from the workspace build that
# `cargo test --workspace` already made (so this is quick after it).
echo "== dquant binary: cargo build -p dquant-cli"
(cd "$here/.." && cargo build --locked --quiet -p dquant-cli)
export DQUANT_BIN="$here/../target/debug/dquant"

if [ "${1:-}" = "--no-tests" ]; then
  echo "$venv/bin/python"
  exit 0
fi

echo "== pytest python/tests"
cd "$here"
exec "$venv/bin/python" -m pytest -q -rs "$@"
