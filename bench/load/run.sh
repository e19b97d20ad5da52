#!/usr/bin/env bash
# The agent under load (the hostile_load area): 64 consumers on one real `dquant serve` for
# 60 s, alone and then with a killed, a stalled and a garbage-sending client mixed in: the
# errors the well-behaved consumers see, fairness, throughput, the agent's memory and threads
# against their bounds. One command:
#
#   bench/load/run.sh [--record] [--smoke] [DATA_DIR]
#
#   DATA_DIR  where the dataset is generated once and reused (default /work/bench-data):
#             zipf256m_int32, 256 Mi Zipf token ids (1 GiB), Megatron int32
#   --smoke   5 s a phase instead of 60 (checks the harness; not for recording)
#   --record  record the figures (bench/results/hostile_load.json; bench/RESULTS.md rendered)
#             and append the table to bench/history/hostile_load.md
# About 3 minutes on 2 vCPU.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RECORD=()
SMOKE=()
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --record) RECORD=(--record); shift ;;
    --smoke) SMOKE=(--smoke); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [[ ${#SMOKE[@]} -gt 0 && ${#RECORD[@]} -gt 0 ]]; then
  echo "bench/load/run.sh: --smoke runs are not recorded" >&2
  exit 2
fi
DATA="${ARGS[0]:-/work/bench-data}"
mkdir -p "$DATA"
cd "$REPO"
source bench/common.sh
build_release
DS="$(zipf256m "$DATA" "$REPO/target/release/dquant")"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
"$REPO/target/release/dquant-offload-bench" load "$DS" --dquant "$REPO/target/release/dquant" \
  "${SMOKE[@]}" --json-out "$OUT/load.json" --agent-log "$OUT/agent"
exec python3 bench/load/figures.py "$OUT/load.json" --command "bench/load/run.sh ${RECORD[*]}" "${RECORD[@]}"
