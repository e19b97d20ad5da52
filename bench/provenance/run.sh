#!/usr/bin/env bash
# Provenance at scale (issue 37): the blend's position at 10^10 samples, resume from a bare
# cursor, locate both ways, audit, and what provenance = true costs in the batch, each against
# a baseline measured in the same run. One command:
#
#   bench/provenance/run.sh [--no-record] [--runs N] [DATA_DIR [OUT_DIR]]
#
#   The plans blend three Megatron fixtures (testkit/fixtures/megatron: 28 documents each,
#   631 samples an epoch at seq_len 255) over 2·10^10 samples, so every figure is taken
#   where a source has been through millions of epochs. The baseline for the blend is the
#   replay the climb replaces, timed over 10^7 samples of the same blend (a plan with
#   renormalizing limits, which the climb does not take) and scaled to 10^10.
#   The cost of provenance = true is dquant-offload-bench throughput, in-process and over
#   the shared-memory ring, with and without it, alternated, on DATA_DIR/zipf256m_int32 (made
#   once: bench/common.sh).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RECORD=1
RUNS=3
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-record) RECORD=0; shift ;;
    --runs) RUNS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
DATA="${ARGS[0]:-/work/bench-data}"
OUT="${ARGS[1]:-$REPO/bench/provenance/out/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$DATA" "$OUT"
cd "$REPO"
echo "== building (release)"
cargo build --release --locked -q -p dquant-bench -p dquant-cli
DQ="$REPO/target/release/dquant"
BENCH="$REPO/target/release/dquant-offload-bench"
source bench/common.sh
machine_info "$OUT/machine.txt"
DS="$(zipf256m "$DATA" "$DQ")"

echo "== provenance at 10^10 ($RUNS runs each)"
python3 bench/provenance/measure.py "$OUT" --dquant "$DQ" --runs "$RUNS" --fixtures "$REPO/testkit/fixtures/megatron"
echo "== the cost of provenance = true (throughput, alternated)"
for r in $(seq "$RUNS"); do
  for prov in "" "--provenance"; do
    tag=$([[ -n $prov ]] && echo on || echo off)
    "$BENCH" throughput "$DS" --runs 1 --cases inproc,agent-shm --seq-len 4095 --batch-size 8 \
      --samples 32768 $prov --json-out "$OUT/throughput-$tag-$r.json" > /dev/null
  done
done
echo "load after: $(uptime)" | tee -a "$OUT/machine.txt"
python3 bench/provenance/measure.py "$OUT" --figures
if [[ $RECORD == 1 ]]; then
  python3 bench/results.py record provenance --figures "$OUT/figures.json" \
    --command "bench/provenance/run.sh --runs $RUNS" \
    --title "Provenance at 10^10 samples: the blend's position without a replay, resume from a bare cursor, locate both ways, audit, and the cost of provenance in the batch" \
    --notes "Plans blend three Megatron fixtures (28 documents each) over 2·10^10 samples of 256 tokens. Times are wall-clock of the release CLI, process start and opening the sources included, best of the runs. The replay baseline is a plan whose renormalizing limits keep the climb out, read from a bare cursor at 10^7 and scaled linearly to 10^10. The throughput rows are dquant-offload-bench on 256 Mi Zipf tokens (130,646 documents) with provenance off and on, alternated."
fi
echo "wrote $OUT"
