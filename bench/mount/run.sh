#!/usr/bin/env bash
# `dquant mount` against local files in the same run (issue 18): sequential and random reads
# and Megatron-Core's GPTDataset, through a real FUSE mount of a real agent on loopback,
# against the local uint16 copy of the same corpus. Needs root and /dev/fuse.
#
# Usage:
#   bench/mount/run.sh                 # 3 runs over the lab's r50k corpus (or one made here),
#                                      # figures recorded in bench/results/mount.json
#   bench/mount/run.sh --runs 1 --gpt-samples 2000 --no-record
#   bench/mount/run.sh --help          # bench.py's options
#
# The Python environment is bench/python's (numpy, megatron-core): its venv is made from
# bench/python/requirements.txt when missing (DQUANT_BENCH_VENV overrides where).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
REQ=bench/python/requirements.txt
VENV="${DQUANT_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dquant/bench-venv-$(sha256sum "$REQ" | cut -c1-12)}"
RECORD=(--record)
ARGS=()
for a in "$@"; do
  case "$a" in
    --no-record) RECORD=() ;;
    *) ARGS+=("$a") ;;
  esac
done
if [ ! -x "$VENV/bin/python" ]; then
  echo "bench/mount/run.sh: creating $VENV (bench/python's requirements)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --no-cache-dir -r "$REQ"
fi
command -v fusermount3 >/dev/null || echo "bench/mount/run.sh: note: fusermount3 missing (apt install fuse3); the mount itself does not need it" >&2
cargo build --release --locked -q -p dquant-cli
exec "$VENV/bin/python" bench/mount/bench.py --dquant target/release/dquant "${RECORD[@]}" "${ARGS[@]}"
