#!/usr/bin/env bash
# Fan-out: 8 readers of one plan as one shared stream (`share`), against 8 separate sessions
# and one lone reader, over TCP and over shared memory, in the same run. Reports the agent's
# CPU, the bytes it read from storage and each reader's throughput, as ratios to the lone
# reader's. The figures are recorded in bench/results/fanout.json (bench/results.py, which
# renders bench/RESULTS.md; RECORD=0 skips it).
#
# Usage:
#   bench/share/run.sh [DATA_DIR [OUT_DIR]]
#
#   DATA_DIR  where the dataset is generated once and reused (default /work/bench-data):
#             zipf256m_int32, 256 Mi Zipf token ids (1 GiB), Megatron int32:
#               dquant corpus zipf DATA/zipf256m_int32 --tokens 268435456 --vocab 50257 --eod 50256
#   OUT_DIR   default bench/share/out/<UTC timestamp>: machine.txt, and tcp, shm, tcp-zstd
#             (.txt tables, .json figures)
#   RUNS=N    rounds of the three scenarios (default 3); READERS=N (default 8);
#   SAMPLES=N samples each reader streams (default 16384: 128 MiB of u16 per reader).
#   RECORD=0  do not record the figures.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DATA="${1:-/work/bench-data}"
OUT="${2:-$REPO/bench/share/out/$(date -u +%Y%m%dT%H%M%SZ)}"
RUNS="${RUNS:-3}"
READERS="${READERS:-8}"
SAMPLES="${SAMPLES:-16384}"
mkdir -p "$DATA" "$OUT"
cd "$REPO"

echo "== building (release)"
cargo build --release -p dquant-bench -p dquant-cli
BENCH="$REPO/target/release/dquant-offload-bench"
DQ="$REPO/target/release/dquant"
source bench/common.sh
machine_info "$OUT/machine.txt"
DS="$(zipf256m "$DATA" "$DQ")"

# The plan's wire codec: u16 (narrowing only: delivery costs more than making a batch) and
# auto+zstd:3 on TCP (compression: making a batch costs more than delivering it). The u16
# TCP run also times bare loopback sends of the lone reader's bytes (--bare-sends): each TCP
# subscriber costs one, the floor its agent CPU is compared with.
for t in tcp shm tcp-zstd; do
  args=("$DS" --readers "$READERS" --runs "$RUNS")
  case "$t" in
    tcp-zstd) args+=(--transport tcp --wire-codec auto+zstd:3 --samples $(( SAMPLES / 4 ))) ;;
    tcp) args+=(--transport tcp --samples "$SAMPLES" --bare-sends) ;;
    *) args+=(--transport "$t" --samples "$SAMPLES") ;;
  esac
  echo "== $t: ${args[*]}"
  "$BENCH" share "${args[@]}" --json-out "$OUT/$t.json" | tee "$OUT/$t.txt"
done
echo "load after: $(uptime)" | tee -a "$OUT/machine.txt"
echo "results in $OUT"
if [[ "${RECORD:-1}" == 1 ]]; then
  python3 bench/share/figures.py "$OUT" > "$OUT/figures.json"
  python3 bench/results.py record fanout --figures "$OUT/figures.json" \
    --command "RUNS=$RUNS READERS=$READERS SAMPLES=$SAMPLES bench/share/run.sh" \
    --notes "Baseline: one lone reader (one session) in the same round; 8 sessions are 8 readers each opening the plan, 8 subscribers one stream opened with share (group 8). Medians of the rounds, on zipf256m_int32 (256 Mi Zipf ids, Megatron int32, warm page cache); plan seq_len 4095, batch 16, output u16; readers, agent and kernel copies share the machine's cores."
fi
