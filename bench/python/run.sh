#!/usr/bin/env bash
# The Python loader benchmark (issue 6), in one command: tokens/s delivered into a Python loop
# that touches every batch, dquant (in-process, and through an agent over shared memory)
# against Megatron-Core's GPTDataset, MosaicML Streaming and LitData, on the same tokens, in
# the same run. See bench/python/README.md.
#
# Usage:
#   bench/python/run.sh                      # full run (~6-7 min after installs), recorded in bench/results/
#   bench/python/run.sh --smoke              # tiny corpus, one run, not recorded: checks the wiring
#   bench/python/run.sh --no-append --runs 5 --seq-len 4096 --batch-size 4
#
# Options (the rest go to bench.py; `bench/python/run.sh --help-bench` lists them):
#   --mb N           corpus size: MB of source text tokenized with r50k (default 256, ~119 M tokens)
#   --tokens N       use only the first N tokens of the corpus
#   --seq-len N      default 2048        --batch-size N   default 8
#   --runs N         timed runs per loader (default 3)
#   --workers LIST   DataLoader worker counts for LitData and TokenDataset (default 1,2,4;
#                    with 1, Megatron-Core and MosaicML Streaming too)
#   --no-workers     skip the DataLoader worker rows (--no-workers1: the same)
#   --loaders LIST   e.g. megatron,mds,litdata,dquant-local,dquant-shm,ceiling (see --help-bench)
#   --min-run-s S    a run repeats whole passes for at least S seconds (default 1)
#   --no-append      do not record (bench/results/python_loaders.json, bench/history/)
#   --smoke          4 MB corpus, 1 run, no append
#
# Environment:
#   DQUANT_BENCH_VENV   the venv (default ~/.cache/dquant/bench-venv-<first 12 hex of
#                       sha256(requirements.txt)>, reused while the requirements don't change)
#   DQUANT_PYBENCH_DIR  corpora, peers' copies and caches (default /var/tmp/dquant-pybench)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
HERE=bench/python
REQ="$HERE/requirements.txt"
DATA="${DQUANT_PYBENCH_DIR:-/var/tmp/dquant-pybench}"
export DQUANT_PYBENCH_DIR="$DATA"
ORIG_ARGS="$*"

MB=256
SMOKE=0
APPEND=1
WORKERS=1,2,4
HELP_BENCH=0
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mb) MB="$2"; shift 2 ;;
    --mb=*) MB="${1#*=}"; shift ;;
    --smoke) SMOKE=1; shift ;;
    --no-append) APPEND=0; shift ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --workers=*) WORKERS="${1#*=}"; shift ;;
    --no-workers|--no-workers1) WORKERS=""; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --help-bench) HELP_BENCH=1; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [[ $SMOKE == 1 ]]; then
  MB=4; APPEND=0; WORKERS=""
  ARGS=(--runs 1 "${ARGS[@]}")
fi
say() { echo "bench/python/run.sh: $*" >&2; }

# 1. The benchmark's own venv, keyed on the requirements.
HASH="$(sha256sum "$REQ" | cut -c1-12)"
VENV="${DQUANT_BENCH_VENV:-$HOME/.cache/dquant/bench-venv-$HASH}"
if ! cmp -s "$REQ" "$VENV/.dquant-requirements" 2>/dev/null; then
  say "installing $REQ into $VENV (torch is ~5 GB with its CUDA wheels; a few minutes)"
  mkdir -p "$(dirname "$VENV")"
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "$REQ"
  cp "$REQ" "$VENV/.dquant-requirements"
fi
PY="$VENV/bin/python"
[[ $HELP_BENCH == 0 ]] || exec "$PY" "$HERE/bench.py" --help

# 2. The dquant command (corpus, agent) and the dquant Python package.
cargo build --release --locked -q -p dquant-cli
DQ="$REPO/target/release/dquant"
if [[ -f python/pyproject.toml ]]; then
  WHEELS="$DATA/wheels"
  rm -rf "$WHEELS"
  say "building the dquant Python package (maturin build --release)"
  (cd python && "$VENV/bin/maturin" build --release --quiet -i "$PY" --out "$WHEELS" >&2)
  "$PY" -m pip install -q --force-reinstall --no-deps "$WHEELS"/*.whl
else
  say "no python/pyproject.toml: the dquant Python package is not there yet; its rows are skipped"
  "$PY" -m pip uninstall -q -y dquant 2>/dev/null || true
fi

# 3. The corpus: real tokens (r50k over the crate sources cargo downloaded), made once.
CORPUS="$DATA/corpus/r50k-${MB}mb"
if [[ ! -f "$CORPUS.idx" || ! -f "$CORPUS.bin" ]]; then
  mkdir -p "$DATA/corpus"
  say "making the corpus $CORPUS ($MB MB of text, r50k)"
  "$DQ" corpus real --quiet --encoding r50k --max-mb "$MB" --ext rs,md,txt "$CORPUS" >&2
fi

# 4. The benchmark.
EXTRA=()
[[ $APPEND == 1 ]] || EXTRA+=(--no-append)
[[ -z $WORKERS ]] || EXTRA+=(--workers "$WORKERS")
CMD="bench/python/run.sh${ORIG_ARGS:+ $ORIG_ARGS}"
exec "$PY" "$HERE/bench.py" --prefix "$CORPUS" --dquant-bin "$DQ" --mb "$MB" \
  --command "$CMD" "${EXTRA[@]}" "${ARGS[@]}"
