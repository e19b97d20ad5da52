#!/usr/bin/env bash
# The cost report (issue 36): CPU-ns per token for the agent and for the host on each path,
# beside the limit measured in the same run, the stages of the agent's producer, and how many
# trainer GPUs (10,000 tokens/s each) one agent core feeds. One command:
#
#   bench/cost/run.sh [--record] [--runs N] [DATA_DIR [OUT_DIR]]
#
#   DATA_DIR  where the dataset is generated once and reused (default /work/bench-data):
#             zipf256m_int32, 256 Mi Zipf token ids (1 GiB), Megatron int32:
#               dquant corpus zipf DATA/zipf256m_int32 --tokens 268435456 --vocab 50257 --eod 50256
#   OUT_DIR   default bench/cost/out/<UTC timestamp>: machine.txt, the measurements' JSON
#             (throughput*.json, breakdown.json, fanout.json, mount.json, python.json,
#             pagecache-start.json, pagecache-after-shuffled.json, cold-shuffled.json and
#             pagecache.json), report.md
#   The default worker pool is the agent's: one worker a core but two, at most 8 (none on 2 vCPU).
#   --runs N  rounds of each throughput case (default 3)
#   --record  record the figures (bench/results/cost.json; bench/RESULTS.md is rendered)
#
# What runs (dquant-offload-bench, release build; about 3 minutes on 2 vCPU):
#   throughput, the agent's default worker pool: plain TCP copy and memcpy (the limits), the
#     plan in this process, on an agent over TCP, TLS and a shared-memory ring, on a host agent
#     chained to a storage agent (both agents' CPU counted), each unshuffled and shuffled, and
#     over TCP with the wire codec auto+zstd:1 (the compress stage);
#   throughput again with --worker-threads 1: the DPU view, one worker thread; and with
#     --worker-threads 0, no pool; and the agent's paths with --map-budget 0 (every token
#     read by pread and then narrowed: the agent's default before int32 datasets were
#     narrowed straight from maps kept with them, within a budget of half the host's memory);
#   breakdown: the producer's stages on one thread (read, narrow, pack, encode, frame+crc);
#   share: 4 subscribers of one shared stream over TCP (fan-out);
#   the dpu preset's 32 KiB LZ4 blocks (dquant convert --preset dpu) decoded in software, on
#     real text (code_r50k_16m: Rust crate sources, generated once by dquant corpus real):
#     the stage BlueField-3's decompression engine takes off the ARM cores;
#   mount: the dataset's file read whole (1 MiB reads) through dquant mount (FUSE) from
#     dquant serve on loopback, a fresh mount each run (bench/cost/mount.py; needs /dev/fuse);
#   Python: the plan read into a Python loop as numpy batches with dquant's package, in the
#     process and from the agent over shared memory (bench/cost/python.py, in the venv
#     python/test.sh --no-tests builds: made once, several GB with torch);
#   a page-cache copy of the dataset's file (cat FILE > /dev/null), the local paths' limit:
#     best of 3 right after the file is dropped from the page cache and read back in order
#     (bench/common.sh cache_in_order: the rates depend on how a file came into the cache),
#     and best of 3 after the runs; the faster is the limit;
#   the page cache a shuffled pass leaves: the file dropped, one shuffled pass of the agent
#     over shm from the disk, then the page-cache copy again (against the one after a read
#     in order: how fast every later pass can be).
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
OUT="${ARGS[1]:-$REPO/bench/cost/out/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$DATA" "$OUT"
cd "$REPO"

echo "== building (release)"
cargo build --release -q -p dquant-bench -p dquant-cli
BENCH="$REPO/target/release/dquant-offload-bench"
DQ="$REPO/target/release/dquant"
source bench/common.sh
machine_info "$OUT/machine.txt"
DS="$(zipf256m "$DATA" "$DQ")"
echo "== the limit at the start: a page-cache copy of the file, cached in order"
python3 bench/cost/report.py "$OUT" --dataset "$DS" --pagecache-into pagecache-start.json

CASES=plain,memcpy,inproc,inproc-shuffled,agent,agent-shuffled,agent-tls,agent-tls-shuffled,agent-shm,agent-shm-shuffled,agent-chain,agent-chain-shuffled
echo "== throughput (the agent's default worker pool)"
"$BENCH" throughput "$DS" --runs "$RUNS" --cases "$CASES" --json-out "$OUT/throughput.json"
echo "== throughput, one worker thread (the DPU view)"
"$BENCH" throughput "$DS" --runs "$RUNS" --cases "$CASES" --worker-threads 1 \
  --json-out "$OUT/throughput-w1.json"
echo "== throughput, no worker pool (each session reads on its own thread)"
"$BENCH" throughput "$DS" --runs "$RUNS" --cases "$CASES" --worker-threads 0 \
  --json-out "$OUT/throughput-w0.json"
echo "== throughput, the agent with --map-budget 0 (every token read by pread, no maps)"
"$BENCH" throughput "$DS" --runs "$RUNS" --cases plain,agent,agent-shuffled,agent-shm,agent-shm-shuffled \
  --map-budget 0 --json-out "$OUT/throughput-pread.json"
echo "== throughput, wire codec auto+zstd:1 (the compress stage)"
"$BENCH" throughput "$DS" --runs "$RUNS" --cases plain,agent --wire-codec auto+zstd:1 \
  --samples 16384 --json-out "$OUT/throughput-zstd.json"
echo "== breakdown (the producer's stages, one thread)"
"$BENCH" breakdown "$DS" --repeats "$RUNS" --json-out "$OUT/breakdown.json"
echo "== fan-out (4 subscribers of one shared stream, TCP)"
FANOUT_SAMPLES=16384
"$BENCH" share "$DS" --readers 4 --runs "$RUNS" --transport tcp --samples "$FANOUT_SAMPLES" \
  --json-out "$OUT/fanout.json"
echo "== a compressed source on a DPU: the dpu preset's LZ4 blocks decoded in software"
CODE="$DATA/code_r50k_16m"
[[ -e "$CODE.idx" ]] || "$DQ" corpus real --max-mb 16 --encoding r50k -q "$CODE" >/dev/null
"$DQ" bench codecs "$CODE" --codecs u16,u16+lz4,u16+lz4hc:9 --block-size 32KiB --no-presets \
  --json -q > "$OUT/dpu.json"
echo "== throughput, wire codec transport (the plan's default on a link) over that real code"
"$BENCH" throughput "$CODE" --runs "$RUNS" --cases plain,agent --wire-codec transport \
  --json-out "$OUT/throughput-transport.json"
echo "== mount: the dataset read whole through dquant mount (FUSE), a fresh mount each run"
python3 bench/cost/mount.py "$DQ" "$DS" --runs "$RUNS" --out "$OUT/mount.json"
echo "== Python: the plan into a Python loop, in-process and from the agent over shm"
PY="$(python/test.sh --no-tests | tail -1)"
"$PY" bench/cost/python.py "$DQ" "$DS" --runs "$RUNS" --out "$OUT/python.json"
echo "== the page cache a shuffled pass leaves: the file dropped, one cold shuffled pass, a copy"
# --cold drops the file from the page cache itself, after stopping agents that map it.
"$BENCH" throughput "$DS" --runs 1 --cases agent-shm-shuffled --cold \
  --json-out "$OUT/cold-shuffled.json"
python3 bench/cost/report.py "$OUT" --dataset "$DS" --pagecache-into pagecache-after-shuffled.json
cache_in_order "$DS.bin"
echo "load after: $(uptime)" | tee -a "$OUT/machine.txt"

REPORT=(python3 bench/cost/report.py "$OUT" --dataset "$DS" --command "bench/cost/run.sh --runs $RUNS"
  --fanout-samples "$FANOUT_SAMPLES")
[[ $RECORD == 0 ]] || REPORT+=(--record)
"${REPORT[@]}"
