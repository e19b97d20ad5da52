#!/usr/bin/env bash
# Issue 15's scale benchmark in one command, each figure against a baseline from the same run:
#
#   corpus   100 M documents in Megatron int32 (`dquant corpus zipf`, short documents: about
#            3.2 G tokens, a 12.8 GB .bin and a 1.9 GB .idx), generated here and deleted at the
#            end unless --keep
#   open     time to open and to the first batch, page cache dropped (cold) and warm, through
#            an agent and in-process (dquant-offload-bench ttfb)
#   memory   the agent's peak RSS with 1, 16 and 64 concurrent sessions streaming the corpus,
#            against the bound 64 MiB + sessions × (prefetch + 2 MiB) (dquant-offload-bench load)
#   resume   first batch after a resume at 10^9 and 10^10 samples with 1, 8 and 100 sources,
#            against a replay; the schedule's cost per batch of 8 at world 1, 512 and 4096 with
#            1, 100 and 1,000 sources (criterion: cargo bench -p dquant-plan -- scale/)
#   shuffled shuffled shared-memory delivery against memcpy, with no worker pool and with one
#            (dquant-offload-bench throughput --cases memcpy,agent-shm-shuffled,agent-shm)
#   lab      (root only) the NIC-bound lab's auto+zstd:1 link use with 0 and 2 workers
#            (bench/lab/run.sh --compressed auto+zstd:1)
#
# Usage:
#   bench/scale/run.sh [--record] [--keep] [--quick] [--skip STEP]... [DATA_DIR [OUT_DIR]]
#
#   DATA_DIR  where the corpus goes (default /var/tmp/dquant-scale; needs about 15 GB free,
#             1.5 GB with --quick)
#   OUT_DIR   results (default bench/scale/out/<UTC time>): machine.txt, summary.md, and per
#             step a .txt (the tool's own tables) and a .json
#   --quick   10 M documents and short phases: a check of the harness (~5 min), not figures
#   --keep    keep the corpus (a later run reuses it)
#   --skip    leave out a step: open, memory, resume, shuffled, lab (repeatable)
#   --record  record the figures as the scale area (bench/scale/figures.py: bench/results/
#             scale.json, bench/RESULTS.md, bench/history/scale.md); needs every step and
#             the full corpus, so not with --quick or --skip. Without it the figures are
#             printed only.
#
# Needs release builds (built here) and, for `open`'s cold case and the lab, root. The machine
# is shared: the load average is recorded before and after; prefer a quiet machine. The full
# run took about 5 minutes on 2 vCPU (AMD EPYC, 2026-11-28), a minute and a half of it making
# the corpus.
set -euo pipefail

COMMAND="bench/scale/run.sh${*:+ $*}"
KEEP=0
QUICK=0
RECORD=0
SKIP=" "
POS=()
while (($#)); do
  case "$1" in
    --keep) KEEP=1 ;;
    --quick) QUICK=1 ;;
    --record) RECORD=1 ;;
    --skip) shift; SKIP+="$1 " ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) POS+=("$1") ;;
  esac
  shift
done
skip() { [[ "$SKIP" == *" $1 "* ]]; }
if ((RECORD)) && { ((QUICK)) || [[ "$SKIP" != " " ]]; }; then
  echo "bench/scale/run.sh: --record needs every step on the full corpus (not --quick or --skip)" >&2
  exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DATA="${POS[0]:-/var/tmp/dquant-scale}"
OUT="${POS[1]:-$REPO/bench/scale/out/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$DATA" "$OUT"
cd "$REPO"

if ((QUICK)); then
  TOKENS=320000000 NAME=zipf10m DURATION=3 CONSUMERS="1 4" REPEATS=1
else
  TOKENS=3200000000 NAME=zipf100m DURATION=10 CONSUMERS="1 16 64" REPEATS=3
fi
CORPUS="$DATA/$NAME"

echo "== building (release)"
cargo build --release -p dquant-cli -p dquant-bench
DQ="$REPO/target/release/dquant"
BENCH="$REPO/target/release/dquant-offload-bench"

source bench/common.sh
machine_info "$OUT/machine.txt"

cleanup() {
  if ((KEEP == 0)); then
    rm -f "$CORPUS.bin" "$CORPUS.idx"
    echo "deleted the corpus in $DATA (--keep keeps it)"
  fi
}
trap cleanup EXIT

# -- corpus -----------------------------------------------------------------------------------
# Only open, memory and shuffled read it.
if skip open && skip memory && skip shuffled; then
  NEED_CORPUS=0
else
  NEED_CORPUS=1
fi
if ((NEED_CORPUS)) && [[ ! -f "$CORPUS.bin" || ! -f "$CORPUS.idx" ]]; then
  need=$((TOKENS * 4 + TOKENS / 32 * 20 + 1000000000))
  free=$(df --output=avail -B1 "$DATA" | tail -1)
  if ((free < need)); then
    echo "bench/scale/run.sh: $DATA has $free bytes free, the corpus needs about $need" >&2
    exit 1
  fi
  echo "== generating $CORPUS ($TOKENS int32 tokens, documents of 32 tokens on average)"
  start=$(date +%s)
  "$DQ" corpus zipf "$CORPUS" --tokens "$TOKENS" --mean-doc-len 32 --vocab 50257 --eod 50256 -q
  echo "generated in $(($(date +%s) - start)) s" | tee "$OUT/corpus.txt"
fi
if ((NEED_CORPUS)); then
  "$DQ" inspect "$CORPUS" --no-sizes --json >"$OUT/corpus.json" 2>/dev/null || true
  ls -l "$CORPUS".bin "$CORPUS".idx | tee -a "$OUT/corpus.txt"
fi

# -- measurements -----------------------------------------------------------------------------
if ! skip open; then
  echo "== open and first batch ($REPEATS repeats, cold and warm)"
  cold=--cold
  [[ $EUID -eq 0 ]] || { cold=; echo "(not root: warm page cache only)"; }
  "$BENCH" ttfb "$CORPUS" --repeats "$REPEATS" $cold --json-out "$OUT/open.json" |
    tee "$OUT/open.txt"
fi

if ! skip memory; then
  for n in $CONSUMERS; do
    echo "== agent memory with $n sessions"
    "$BENCH" load "$CORPUS" --consumers "$n" --no-hostile --duration "$DURATION" \
      --warmup 1 --json-out "$OUT/memory_$n.json" | tee "$OUT/memory_$n.txt"
  done
fi

if ! skip resume; then
  echo "== resume and schedule cost (criterion)"
  cargo bench -p dquant-plan --bench schedule -- scale/ 2>&1 | tee "$OUT/resume.txt"
fi

if ! skip shuffled; then
  for w in 0 1; do
    echo "== shuffled shared-memory delivery against memcpy, worker threads $w"
    "$BENCH" throughput "$CORPUS" --runs 1 --cases memcpy,agent-shm-shuffled,agent-shm \
      --output u16 --worker-threads "$w" --json-out "$OUT/shuffled_w$w.json" |
      tee "$OUT/shuffled_w$w.txt"
  done
fi

if ! skip lab; then
  if [[ $EUID -ne 0 ]]; then
    echo "== lab skipped (needs root for network namespaces)"
  else
    size=50
    ((QUICK)) && size=5
    # Rounds alternating the pool's size: a neighbour's load then weighs on both alike.
    for round in $(seq "$REPEATS"); do
      for w in 0 2; do
        echo "== lab auto+zstd:1, worker threads $w, round $round"
        bench/lab/run.sh --no-append --size "$size" --corpora r50k --compressed auto+zstd:1 \
          --runs 1 --worker-threads "$w" 2>&1 | tee "$OUT/lab_w${w}_r$round.txt"
      done
    done
  fi
fi

echo "load after: $(uptime)" | tee -a "$OUT/machine.txt"

# -- summary ----------------------------------------------------------------------------------
python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, os, re, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None

c = load("corpus.json")
if c:
    print(f"corpus: {c.get('documents')} documents, {c.get('tokens')} tokens\n")
o = load("open.json")
if o:
    print("| open → first batch, median ms | agent | in-process |\n| --- | --- | --- |")
    for m in o["median_total_s"]:
        agent, inproc = m["agent"], m["inproc"]
        f = lambda v: "—" if v is None else f"{v * 1000:.1f}"
        print(f"| {'cold' if m['cold'] else 'warm'} | {f(agent)} | {f(inproc)} |")
    print()
rows = []
for name in sorted(os.listdir(out), key=lambda n: int(re.sub(r"\D", "", n) or 0)):
    if name.startswith("memory_") and name.endswith(".json"):
        m = load(name)
        ph = m["phases"][-1]
        a = ph["agent"]
        rows.append((m["consumers"], a["idle_rss_kib"], a["vm_hwm_kib"], a["rss_bound_kib"],
                     m["per_session_bytes"]["prefetch"], ph["errors"]))
if rows:
    print("| sessions | idle RSS MiB | peak RSS MiB | bound MiB | errors |\n| --- | --- | --- | --- | --- |")
    for n, idle, hwm, bound, _, err in rows:
        print(f"| {n} | {idle / 1024:.0f} | {hwm / 1024:.0f} | {bound / 1024:.0f} | {err} |")
    if len(rows) > 1:
        (n1, _, h1, _, pf, _), (nn, _, hn, _, _, _) = rows[0], rows[-1]
        target = nn * (pf + (2 << 20)) / 2**20
        print(f"\nRSS({nn}) − RSS({n1}) = {(hn - h1) / 1024:.0f} MiB; target ≤ {nn} × "
              f"(prefetch {pf / 2**20:.0f} MiB + 2 MiB) = {target:.0f} MiB\n")
for w in (0, 1):
    t = load(f"shuffled_w{w}.json")
    if t:
        print(f"shuffled, worker threads {w}: see shuffled_w{w}.txt (ratio to memcpy per case)")
for name in sorted(n for n in os.listdir(out) if n.startswith("lab_w")):
    print(f"lab auto+zstd:1: see {name}")
EOF
echo "results in $OUT"

echo "== figures"
FIGURES=(python3 bench/scale/figures.py "$OUT" --command "$COMMAND")
((RECORD)) && FIGURES+=(--record)
"${FIGURES[@]}"
