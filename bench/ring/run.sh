#!/usr/bin/env bash
# The shared-memory ring (the ring area): batches from an agent process over a ring against a
# one-thread memcpy of the same bytes, unshuffled and shuffled; the consumer's CPU per GB over
# shared memory against the TCP path; and the ring alone (a producer process, no plan) against
# memcpy, the consumer reading every byte with the ring's crc32c on. One command:
#
#   bench/ring/run.sh [--record] [--runs N] [DATA_DIR]
#
#   DATA_DIR  where the dataset is generated once and reused (default /work/bench-data):
#             zipf256m_u16: 256 Mi Zipf token ids, Megatron uint16 (512 MiB; made once
#             from zipf256m_int32 with dquant convert --codec u16)
#   --runs N  rounds (default 3; about 40 s a round on 2 vCPU)
#   --record  record the figures (bench/results/ring.json; bench/RESULTS.md rendered) and
#             append the table to bench/history/ring.md
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$REPO/bench/common.sh"
RUNS=3
bench_args "$0" "$@"
DATA="${ARGS[0]:-/work/bench-data}"
mkdir -p "$DATA"
cd "$REPO"
build_release
DS="$(zipf256m_u16 "$DATA" "$REPO/target/release/dquant")"
BENCH="$REPO/target/release/dquant-offload-bench"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
"$BENCH" throughput "$DS" --runs "$RUNS" \
  --cases memcpy,agent,agent-shm,agent-shuffled,agent-shm-shuffled --samples 300000 \
  --json-out "$OUT/agent.json"
"$BENCH" ring --gb 2 --runs "$RUNS" --json-out "$OUT/ring.json"
exec python3 bench/ring/figures.py "$OUT/agent.json" "$OUT/ring.json" \
  --command "bench/ring/run.sh ${RECORD[*]} --runs $RUNS" "${RECORD[@]}"
