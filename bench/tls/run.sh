#!/usr/bin/env bash
# What TLS costs on the data plane: an agent serving TLS 1.3 (rustls) against the plaintext
# agent and a plain TCP copy of the same bytes, in the same runs; throughput and CPU per GB on
# both sides, unshuffled and shuffled. One command:
#
#   bench/tls/run.sh [--record] [--runs N] [DATA_DIR]
#
#   DATA_DIR  where the dataset is generated once and reused (default /work/bench-data):
#             zipf256m_u16: 256 Mi Zipf token ids, Megatron uint16 (512 MiB; made once
#             from zipf256m_int32 with dquant convert --codec u16)
#   --runs N  rounds of the five cases (default 3; about 20 s a round on 2 vCPU)
#   --record  record the figures (bench/results/tls.json; bench/RESULTS.md rendered) and
#             append the table to bench/history/tls.md
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
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
"$REPO/target/release/dquant-offload-bench" throughput "$DS" --runs "$RUNS" \
  --cases plain,agent,agent-tls,agent-shuffled,agent-tls-shuffled --samples 150000 \
  --json-out "$OUT/tls.json"
exec python3 bench/tls/figures.py "$OUT/tls.json" --command "bench/tls/run.sh ${RECORD[*]} --runs $RUNS" "${RECORD[@]}"
