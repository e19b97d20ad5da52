#!/usr/bin/env bash
# The agent's worker pool (issue 36): its CPU cost where reads are fast (the page cache) and
# its gain where they wait (the disk), for no pool, 8 workers as by default, and 8 workers
# spreading every batch; and compression ahead over TCP (2 workers against none). One command:
#
#   bench/worker_pool/run.sh [--record] [--rounds N] [DATA_DIR]
#
#   DATA_DIR  where the dataset is generated once and reused (default /work/bench-data):
#             zipf256m_int32, 256 Mi Zipf token ids (1 GiB), Megatron int32
#   --rounds N  rounds, the settings alternated in each (default 3; about 1.5 minutes a round
#             on 2 vCPU)
#   --record  record the figures (bench/results/worker_pool.json; bench/RESULTS.md rendered)
#             and append the table to bench/history/worker_pool.md
#
# The cold case drops the dataset's file from the page cache (posix_fadvise) before each run:
# it needs the file on a disk, not on tmpfs.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$REPO/bench/common.sh"
RUNS=3
bench_args "$0" "$@"
DATA="${ARGS[0]:-/work/bench-data}"
mkdir -p "$DATA"
cd "$REPO"
build_release
DS="$(zipf256m "$DATA" "$REPO/target/release/dquant")"
CMD="bench/worker_pool/run.sh ${RECORD[*]} --rounds $RUNS"
exec python3 bench/worker_pool/bench.py --bench "$REPO/target/release/dquant-offload-bench" \
  --data "$DS" --rounds "$RUNS" --command "${CMD//  / }" "${RECORD[@]}"
