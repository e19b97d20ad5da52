#!/usr/bin/env bash
# Resume at scale (the resume area): the first batch after a resume at 10^9 and 10^10
# samples from a cursor with the blend's per-source counts, against the replay a cursor
# without them would make; the same end to end through the release CLI, in-process and
# through an agent; and the schedule's cost per batch of 8 at world 4096 with 1, 100 and
# 1,000 sources. One command:
#
#   bench/resume/run.sh [--no-record] [--runs N] [OUT_DIR]
#
#   Criterion: cargo bench -p dquant-plan --bench schedule -- '^scale/(resume|batch)/'
#   (weights 1..n over 2^62 samples). End to end: 100 sources (the r50k_int32 fixture of
#   testkit/fixtures/megatron, weights 1..100), a plan ending 8 samples after 10^10; the
#   cursor's counts come from `dquant audit --until 10^10` (the climb), the agent is
#   `dquant serve` on loopback. Times are wall-clock of the CLI, process start and opening
#   the 100 sources included. About 4 minutes on 2 vCPU after the build.
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
OUT="${ARGS[0]:-$REPO/bench/resume/out/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
cd "$REPO"
source bench/common.sh
echo "== building (release)"
cargo build --release --locked -q -p dquant-cli
machine_info "$OUT/machine.txt"
echo "== criterion: scale/resume and scale/batch"
cargo bench -q -p dquant-plan --bench schedule -- '^scale/(resume|batch)/' > "$OUT/criterion.txt"
echo "== end to end at 10^10 ($RUNS runs each)"
python3 bench/resume/measure.py "$OUT" --dquant "$REPO/target/release/dquant" --runs "$RUNS" \
  --fixtures "$REPO/testkit/fixtures/megatron"
python3 bench/resume/measure.py "$OUT" --figures --criterion "$REPO/target/criterion"
if [[ $RECORD == 1 ]]; then
  python3 bench/results.py record resume --figures "$OUT/figures.json" \
    --command "bench/resume/run.sh --runs $RUNS" \
    --machine "$(sed -n 's/^cpu: *//p' "$OUT/machine.txt"), $(sed -n 's/^nproc: *//p' "$OUT/machine.txt") vCPU" \
    --notes "Criterion plan: weights 1, 2, …, n, 2⁶² samples, seq_len 4096; 'with counts' is iter_rank(cursor) plus the first batch of 8, the baseline 'replay' the per-sample cost of the seek a cursor without counts would make if it replayed (over 10⁶ samples, same run; a bare cursor climbs instead: the provenance area). End to end is the release dquant binary on 100 sources (the r50k_int32 fixture 100 times, weights 1..100, seq_len 255), a plan ending 8 samples after the cursor; the cursor's counts are dquant audit's at 10¹⁰. The schedule rows are criterion means at world 4096; 100 and 1,000 sources use the kinetic tournament, one source the O(1) jump."
fi
echo "wrote $OUT"
