#!/usr/bin/env bash
# Megatron-order datasets (issue 33), in one command: dquant's index build and reads against
# Megatron-Core's, in the same run, on synthetic Zipf corpora (`dquant corpus zipf`): ~10 M
# documents of ~30 tokens for the build, ~200 k documents of ~1,000 tokens for the reads, and
# ~1 M and ~100 M documents of ~30 tokens beside the 10 M for a rank's memory with agent=.
# Both sides are first checked to give identical samples. Recorded in
# bench/results/megatron.json unless --no-record.
#
# Usage:
#   bench/megatron/run.sh                 # ~3 min after the corpora exist (16 GB: 12 of them
#                                         # the 100 M-document corpus, made in ~2 min)
#   bench/megatron/run.sh --no-record --repeat 1
#
# Environment:
#   DQUANT_MEGATRON_BENCH_DIR  the corpora (default /var/tmp/dquant-megatron)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
DATA="${DQUANT_MEGATRON_BENCH_DIR:-/var/tmp/dquant-megatron}"
RECORD=1
ARGS=()
for a in "$@"; do
  case "$a" in
    --no-record) RECORD=0 ;;
    *) ARGS+=("$a") ;;
  esac
done

cargo build --release --locked --quiet -p dquant-cli
PY=$(python/test.sh --no-tests | tail -1)
mkdir -p "$DATA"
[ -f "$DATA/zipf10m.idx" ] || target/release/dquant corpus zipf "$DATA/zipf10m" \
  --tokens 300000000 --mean-doc-len 30 --eod 50256 --quiet
[ -f "$DATA/zipf1m.idx" ] || target/release/dquant corpus zipf "$DATA/zipf1m" \
  --tokens 30000000 --mean-doc-len 30 --eod 50256 --quiet
[ -f "$DATA/zipf100m.idx" ] || target/release/dquant corpus zipf "$DATA/zipf100m" \
  --tokens 3000000000 --mean-doc-len 30 --eod 50256 --quiet
[ -f "$DATA/zipf1k.idx" ] || target/release/dquant corpus zipf "$DATA/zipf1k" \
  --tokens 200000000 --mean-doc-len 1000 --eod 50256 --quiet

figures=$(mktemp --suffix .json)
trap 'rm -f "$figures"' EXIT
"$PY" bench/megatron/bench.py "$DATA/zipf10m" "$DATA/zipf1k" --small-prefix "$DATA/zipf1m" \
  --large-prefix "$DATA/zipf100m" \
  --figures "$figures" "${ARGS[@]}" \
  2> >(grep -v -E "INFO|WARNING|warn" >&2)
if [ "$RECORD" = 1 ]; then
  python3 bench/results.py record megatron --figures "$figures" \
    --command "bench/megatron/run.sh ${ARGS[*]}" \
    --title "Megatron-order datasets: dquant.megatron against Megatron-Core's builder"
fi
