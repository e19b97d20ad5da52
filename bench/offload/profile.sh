#!/usr/bin/env bash
# Where the offload path's CPU goes, per thread, from a system-wide `perf record` (software
# cpu-clock event: works in VMs without hardware counters) around each throughput case.
#
# Usage: bench/offload/profile.sh [DATA_PREFIX [OUT_DIR]]
#   DATA_PREFIX  a Megatron u16 dataset (default /work/bench-data/zipf1g_u16, made by run.sh)
#   OUT_DIR      default bench/offload/out/profile-<UTC timestamp>; gets perf_<case>.data and
#                <case>.txt: CPU seconds per GB of payload by thread and by kind of work.
# Needs perf and root (or perf_event_paranoid <= 0). Threads are told apart by name: the
# agent's dquant-produce (plan work) and dquant-conn (frame sender), the consumer's main thread
# (dquant-offload-; the baseline's sender process has the same name). Run on a quiet machine:
# samples of other processes are listed too, so a busy machine shows up in the output.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DATA="${1:-/work/bench-data/zipf1g_u16}"
OUT="${2:-$REPO/bench/offload/out/profile-$(date -u +%Y%m%dT%H%M%SZ)}"
RUNS=3
mkdir -p "$OUT"
cd "$REPO"
cargo build --release -p dquant-bench
BENCH="$REPO/target/release/dquant-offload-bench"
"$BENCH" throughput "$DATA" --runs 1 --cases plain > /dev/null 2>&1   # warms the page cache
for c in plain agent agent-shuffled inproc; do
  perf record -a -g -F 999 -e cpu-clock -o "$OUT/perf_$c.data" > /dev/null 2>&1 &
  PERF=$!
  sleep 0.5
  "$BENCH" throughput "$DATA" --runs "$RUNS" --cases "$c" --no-warm --json-out "$OUT/$c.json" > /dev/null
  kill -INT "$PERF"; wait "$PERF" || true
  GB=$(python3 -c "import json; d=json.load(open('$OUT/$c.json')); print(sum(m['bytes'] for m in d['measurements'])/1e9)")
  {
    echo "case $c: $RUNS streams, $GB GB of payload; CPU seconds per GB of payload (perf samples / 999 Hz / GB)"
    echo "includes process start-up and open(); 'swapper' is idle time of the 2 CPUs"
    perf report -i "$OUT/perf_$c.data" --stdio --sort comm -n --no-children -g none 2>/dev/null \
      | grep -v '^#' | grep '%' | head -8 \
      | awk -v GB="$GB" '{printf "  %-18s %6.3f s/GB  (%s of samples)\n", $3, $2/999/GB, $1}'
    for comm in dquant-produce dquant-conn dquant-offload-; do
      perf report -i "$OUT/perf_$c.data" --stdio --sort comm,sym -n --no-children -g none 2>/dev/null \
        | grep -v '^#' | grep '%' | awk -v C="$comm" -v GB="$GB" '
        $3 == C {
          n = $2; sym = $5; tot += n
          if (sym ~ /or_all|first_over/) k = "check_fits scans (or_all)"
          else if (sym ~ /load_u16|decode_width|load_plain/) k = "decode stored u16 -> u32 (load_u16)"
          else if (sym ~ /store_u16|store_plain|encode_width/) k = "encode u32 -> u16 (store_u16)"
          else if (sym ~ /memset/) k = "memset (zero-fill)"
          else if (sym ~ /memmove|memcpy/) k = "memmove (user-space copies)"
          else if (sym ~ /crc32c|crc_u64/) k = "crc32c"
          else if (sym ~ /_copy_to_iter|copy_page_to_iter/) k = "kernel copy to user (pread, recv)"
          else if (sym ~ /_copy_from_iter/) k = "kernel copy from user (send)"
          else if (sym ~ /spin_unlock_irq|finish_task_switch|schedule|futex|wake|softirq|tcp_|skb|ip_|net_|__dev|loopback/) k = "wake-ups, scheduling, TCP stack"
          else if ($4 == "[k]") k = "other kernel (page-cache lookup, syscalls)"
          else k = "other user"
          s[k] += n
        }
        END {
          if (tot == 0) exit
          printf "thread %s: %.3f s/GB\n", C, tot/999/GB
          fflush()
          cmd = "sort -rn | cut -f2-"
          for (k in s) printf "%d\t  %-45s %6.3f s/GB  %5.1f%%\n", s[k], k, s[k]/999/GB, 100*s[k]/tot | cmd
          close(cmd)
        }'
    done
  } | tee "$OUT/$c.txt"
done
echo "profiles in $OUT"
