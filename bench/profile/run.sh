#!/usr/bin/env bash
# Where the agent's CPU goes on the paths that miss their goals (issue 36, item 2): the agent
# profiled with perf (cpu-clock samples, every CPU) while it delivers over a shared-memory
# ring, unshuffled and shuffled, over TCP, and over TCP with the wire codec auto+zstd:1 (the
# lab's compressed path); and the limit those paths are held to, a page-cache copy of the same
# file (cat FILE > /dev/null), profiled the same way. Each agent's samples are put in stages by
# symbol (bench/profile/report.py) and turned into CPU ns per token with the agent CPU the same
# run measured. Then fan-out (dquant-offload-bench share, 8 readers, over shm and TCP), its
# samples cut by scenario (a lone stream, 8 sessions, 8 subscribers of one stream); and the
# schedule at world 4096 x 1,000 sources (criterion, then perf on the same bench); the read
# paths, pread against a map (criterion: why the agent pays the page-cache copy); and Python:
# dquant.torch.TokenDataset with and without boundary outputs, and through torch's DataLoader
# with no workers and with one (bench/profile/python.py, in bench/python's venv: made once,
# several GB with torch). One command:
#
#   bench/profile/run.sh [--record] [--runs N] [DATA_DIR [OUT_DIR]]
#
#   DATA_DIR  where the dataset is generated once and reused (default /work/bench-data):
#             zipf256m_int32, the cost report's dataset (1 GiB, Megatron int32)
#   OUT_DIR   default bench/profile/out/<UTC timestamp>: perf data, perf report text, the
#             throughput JSON of each case, report.md
#   --runs N  rounds of each case while perf samples (default 3)
#   --record  record the figures (bench/results/profile.json; bench/RESULTS.md is rendered)
#
# Needs perf (Debian's linux-perf; installed when missing) and root (system-wide sampling).
# About 5 minutes on 2 vCPU after the build and bench/python's venv and corpus.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RECORD=0
RUNS=3
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --record) RECORD=1; shift ;;
    --runs) RUNS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
DATA="${ARGS[0]:-/work/bench-data}"
OUT="${ARGS[1]:-$REPO/bench/profile/out/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$DATA" "$OUT"
cd "$REPO"
command -v perf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf; }

echo "== building (release)"
cargo build --release -q -p dquant-bench -p dquant-cli
BENCH="$REPO/target/release/dquant-offload-bench"
source bench/common.sh
machine_info "$OUT/machine.txt"
DS="$(zipf256m "$DATA" "$REPO/target/release/dquant")"
cat "$DS.bin" > /dev/null

# Every CPU, so that the agent's process (its session, sender and worker threads) is in the
# samples; report.py keeps the agent's threads by name.
profile() {
  local name="$1"; shift
  perf record -q -e cpu-clock -F 999 -a -o "$OUT/$name.data" -- "$@" > /dev/null
  perf report -i "$OUT/$name.data" --no-children --sort comm,dso,sym -g none --stdio -n \
    -t $'\t' 2>/dev/null | grep -v '^#' | grep -v '^$' > "$OUT/$name.txt"
}
for case in agent-shm agent-shm-shuffled agent; do
  echo "== $case (perf record, $RUNS rounds)"
  profile "$case" "$BENCH" throughput "$DS" --runs "$RUNS" --cases "$case" --no-warm \
    --json-out "$OUT/$case.json"
done
echo "== agent over TCP with the wire codec auto+zstd:1 (the lab's compressed path; perf record)"
profile agent-zstd "$BENCH" throughput "$DS" --runs "$RUNS" --cases agent --no-warm \
  --wire-codec auto+zstd:1 --samples 16384 --json-out "$OUT/agent-zstd.json"
# Fan-out: the share bench runs a lone reader, 8 sessions and 8 subscribers of one stream in
# turn and prints when each ran on CLOCK_MONOTONIC, the clock these samples carry, so
# report.py cuts the samples by scenario.
for t in shm tcp; do
  echo "== fan-out over $t, 8 readers (perf record, $RUNS rounds)"
  perf record -q -k CLOCK_MONOTONIC -e cpu-clock -F 999 -a -o "$OUT/fanout-$t.data" -- \
    "$BENCH" share "$DS" --readers 8 --transport "$t" --runs "$RUNS" \
    --json-out "$OUT/fanout-$t.json" > /dev/null
  perf script -i "$OUT/fanout-$t.data" -F comm,tid,time,ip,sym 2>/dev/null > "$OUT/fanout-$t.txt"
done
# The schedule at world 4096 x 1,000 sources (and at world 64 x 10, the issue's other target):
# criterion measures a batch's cost, then the same bench runs under perf for a fixed time
# (--profile-time: no analysis, just iterations).
SCHED="scale/batch/world 4096, 1000 sources"
echo "== the schedule: $SCHED (criterion, then perf record)"
cargo bench -q -p dquant-plan --bench schedule -- '^scale/batch/world (4096, 1000|64, 10) sources$' \
  > "$OUT/schedule-criterion.txt"
for c in "4096, 1000" "64, 10"; do
  cp "target/criterion/scale_batch/world $c sources/new/estimates.json" \
    "$OUT/schedule-estimates-${c/, /x}.json"
done
SCHED_BIN="$(cargo bench -q -p dquant-plan --bench schedule --no-run --message-format json \
  | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')"
perf record -q -e cpu-clock -F 999 -o "$OUT/schedule.data" -- "$SCHED_BIN" --bench \
  --profile-time 5 --exact "$SCHED" > /dev/null
perf report -i "$OUT/schedule.data" --no-children --sort comm,dso,sym -g none --stdio -n \
  -t $'\t' 2>/dev/null | grep -v '^#' | grep -v '^$' > "$OUT/schedule.txt"
# Why not map the sources: narrowing a 256 MiB int32 file to u16 out of a warm page cache by
# pread, by a map made for the pass, and by a map kept over passes, against the page-cache
# copy (criterion, crates/dquant-storage/benches/read_paths.rs).
echo "== read paths: pread against a map (criterion)"
cargo bench -q -p dquant-storage --bench read_paths > "$OUT/read-paths-criterion.txt"
for c in pagecache_copy pread_narrow fresh_map_narrow kept_map_narrow shuffled_reads \
  kept_map_in_order_narrow kept_map_shuffled_narrow; do
  cp "target/criterion/read_paths/$c/new/estimates.json" "$OUT/read-paths-$c.json"
done
# Python: boundary outputs and DataLoader workers, in bench/python's venv (torch) on its
# corpus; a one-loader run of bench/python makes both and installs the dquant wheel built
# from this tree. bench/profile/python.py prints each case's window (CLOCK_MONOTONIC) and
# its processes.
echo "== Python: boundary outputs and DataLoader workers (bench/python's venv and corpus)"
bench/python/run.sh --no-append --runs 1 --loaders ceiling --no-workers > "$OUT/python-setup.txt"
PYB="${DQUANT_BENCH_VENV:-$HOME/.cache/dquant/bench-venv-$(sha256sum bench/python/requirements.txt | cut -c1-12)}/bin/python"
CORPUS="${DQUANT_PYBENCH_DIR:-/var/tmp/dquant-pybench}/corpus/r50k-256mb"
perf record -q -k CLOCK_MONOTONIC -e cpu-clock -F 999 -a -o "$OUT/python.data" -- \
  "$PYB" bench/profile/python.py "$CORPUS" --eod 50256 --out "$OUT/python.json"
perf script -i "$OUT/python.data" -F comm,pid,tid,time,ip,sym,dso 2>/dev/null > "$OUT/python.txt"
echo "== the limit: a page-cache copy of the file (cat FILE > /dev/null), $RUNS times"
profile pagecache bash -c "for i in \$(seq $RUNS); do cat '$DS.bin' > /dev/null; done"
echo "load after: $(uptime)" | tee -a "$OUT/machine.txt"

REPORT=(python3 bench/profile/report.py "$OUT" --dataset "$DS" --runs "$RUNS"
  --command "bench/profile/run.sh --runs $RUNS")
[[ $RECORD == 0 ]] || REPORT+=(--record)
"${REPORT[@]}"
