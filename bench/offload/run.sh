#!/usr/bin/env bash
# The offload agent's end-to-end benchmark: throughput against a plain TCP copy and (shared
# memory) against memcpy, the shared-memory ring alone, agent memory
# against its limit, and time to first batch on a 10 GiB dataset, each against a baseline
# measured in the same run. bench/offload/figures.py prints the area's eight figures from the
# files this writes, and with --record records them (bench/results/offload.json,
# bench/RESULTS.md, bench/history/offload.md).
#
# Usage:
#   bench/offload/run.sh [--record] [--clean] [DATA_DIR [OUT_DIR]]
#
#   DATA_DIR  where the datasets are generated once and reused (default /work/bench-data;
#             keep it outside the repository). Needs about 13 GiB free, 25 GB to be safe.
#   OUT_DIR   where results go (default bench/offload/out/<UTC timestamp>): machine.txt,
#             and for each measurement a .txt (tables) and a .json.
#   --clean   delete the generated datasets at the end.
#   --record  record the figures as the offload area.
#   RUNS=N    throughput rounds (default 3); REPEATS=N time-to-first-batch repeats (default 9).
#
# Datasets (deterministic; generated only when missing):
#   zipf1g_u16  1 Gi tokens (2 GiB) of Zipf ids, Megatron uint16: throughput, memory
#     dquant corpus zipf DATA/zipf1g_int32 --tokens 1073741824 --vocab 50257 --eod 50256
#     dquant convert DATA/zipf1g_int32 DATA/zipf1g_u16 --codec u16
#   zipf10g     2.68 G tokens (10 GiB) of Zipf ids, Megatron int32: time to first batch, memory
#     dquant corpus zipf DATA/zipf10g --tokens 2684354560 --vocab 50257 --eod 50256
#   With less than 25 GB free the 10 GiB dataset is shrunk to fit, and the script says so.
#
# Where the agent's time goes, per thread (perf): bench/offload/profile.sh, run separately.
#
# Benchmarks need release builds; this builds them. The machine is shared: the load average
# is recorded before and after, and in every throughput row; prefer a quiet machine.
set -euo pipefail

COMMAND="RUNS=${RUNS:-3} REPEATS=${REPEATS:-9} bench/offload/run.sh${*:+ $*}"
CLEAN=0
RECORD=0
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --clean) CLEAN=1 ;;
    --record) RECORD=1 ;;
    *) echo "bench/offload/run.sh: unknown option $1 (see the head of this script)" >&2; exit 2 ;;
  esac
  shift
done
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DATA="${1:-/work/bench-data}"
OUT="${2:-$REPO/bench/offload/out/$(date -u +%Y%m%dT%H%M%SZ)}"
RUNS="${RUNS:-3}"
REPEATS="${REPEATS:-9}"
mkdir -p "$DATA" "$OUT"
cd "$REPO"

echo "== building (release)"
cargo build --release -p dquant-bench
BENCH="$REPO/target/release/dquant-offload-bench"
DQ="$REPO/target/release/dquant"
need_dquant() { [[ -x "$DQ" ]] || cargo build --release -p dquant-cli; }

source bench/common.sh
machine_info "$OUT/machine.txt"
echo "rustc:   $(rustc --version)" | tee -a "$OUT/machine.txt"

# -- datasets ---------------------------------------------------------------------------------
avail() { df --output=avail -B1 "$DATA" | tail -1; }
if [[ ! -f "$DATA/zipf1g_u16.bin" || ! -f "$DATA/zipf1g_u16.idx" ]]; then
  echo "== generating $DATA/zipf1g_u16"
  need_dquant
  "$DQ" corpus zipf "$DATA/zipf1g_int32" --tokens 1073741824 --vocab 50257 --eod 50256 -q
  "$DQ" convert "$DATA/zipf1g_int32" "$DATA/zipf1g_u16" --codec u16 -q
  rm -f "$DATA/zipf1g_int32.bin" "$DATA/zipf1g_int32.idx"
fi
if [[ ! -f "$DATA/zipf10g.bin" || ! -f "$DATA/zipf10g.idx" ]]; then
  TOKENS=2684354560
  FREE=$(avail)
  if (( FREE < 25000000000 )); then
    TOKENS=$(( (FREE - 5000000000) / 4 ))
    echo "WARNING: only $FREE bytes free in $DATA; the '10 GiB' dataset has $TOKENS tokens ($(( TOKENS * 4 )) bytes)" | tee -a "$OUT/machine.txt"
  fi
  echo "== generating $DATA/zipf10g ($TOKENS int32 tokens)"
  need_dquant
  "$DQ" corpus zipf "$DATA/zipf10g" --tokens "$TOKENS" --vocab 50257 --eod 50256 -q
fi
ls -l "$DATA"/zipf1g_u16.* "$DATA"/zipf10g.* | tee -a "$OUT/machine.txt"

# -- measurements -----------------------------------------------------------------------------
echo "== throughput ($RUNS runs): TCP against a plain copy, shared memory against memcpy"
"$BENCH" throughput "$DATA/zipf1g_u16" --runs "$RUNS" --json-out "$OUT/throughput.json" \
  | tee "$OUT/throughput.txt"

echo "== the shared-memory ring alone ($RUNS runs)"
"$BENCH" ring --gb 2 --runs "$RUNS" --json-out "$OUT/ring.json" | tee "$OUT/ring.txt"

echo "== agent memory: 2 GiB u16 dataset, 3 passes, shuffled"
"$BENCH" rss "$DATA/zipf1g_u16" --passes 3 --json-out "$OUT/rss_u16.json" | tee "$OUT/rss_u16.txt"
echo "== agent memory: 10 GiB int32 dataset, 1 pass, shuffled"
"$BENCH" rss "$DATA/zipf10g" --json-out "$OUT/rss_10g.json" | tee "$OUT/rss_10g.txt"

echo "== time to first batch ($REPEATS repeats, warm and cold page cache)"
"$BENCH" ttfb "$DATA/zipf10g" --repeats "$REPEATS" --cold --json-out "$OUT/ttfb.json" \
  | tee "$OUT/ttfb.txt"

echo "== where the time goes (one thread, stage by stage)"
"$BENCH" breakdown "$DATA/zipf1g_u16" --json-out "$OUT/breakdown.json" | tee "$OUT/breakdown.txt"
"$BENCH" breakdown "$DATA/zipf1g_u16" --shuffle --json-out "$OUT/breakdown_shuffled.json" \
  | tee "$OUT/breakdown_shuffled.txt"

echo "load after: $(uptime)" | tee -a "$OUT/machine.txt"
echo "results in $OUT"
echo "== figures"
FIGURES=(python3 bench/offload/figures.py "$OUT" --command "$COMMAND")
((RECORD)) && FIGURES+=(--record)
"${FIGURES[@]}"
if (( CLEAN )); then
  rm -f "$DATA"/zipf1g_u16.bin "$DATA"/zipf1g_u16.idx "$DATA"/zipf10g.bin "$DATA"/zipf10g.idx
  echo "deleted the generated datasets in $DATA"
fi
