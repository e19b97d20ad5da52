#!/usr/bin/env bash
# Batches into GPU memory (bench/gpu/feed.py): dquant's loaders on a host with a CUDA device,
# against the host-to-device copies of the same batches alone, in the same run.
#
# CI machines and this project's VMs have no GPU, so the run is in three steps:
#
#   bench/gpu/run.sh prepare          here: builds the release CLI and the Python package and
#                                     stages them, stripped, in .dev-gpu/ (git-ignored)
#   bash bench/gpu/run.sh measure OUT on the GPU host, from the repository root with .dev-gpu/
#                                     beside it: needs python3 with torch and numpy (no
#                                     install, no network); writes OUT/results.json
#   bench/gpu/run.sh record DIR       here: records DIR/results.json as the gpu_feed area
#                                     (bench/results.py), with the GPU host as its machine
#
# Options after `measure OUT` go to feed.py (--tokens, --workers, --runs, --min-run-s,
# --agent-args, --rows).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
STAGE=.dev-gpu

prepare() {
  cargo build --release --locked -p dquant-cli
  python/test.sh --no-tests >/dev/null
  rm -rf "$STAGE" && mkdir -p "$STAGE/python/dquant"
  strip -o "$STAGE/dquant" target/release/dquant
  cp python/python/dquant/*.py "$STAGE/python/dquant/"
  strip -o "$STAGE/python/dquant/_dquant.abi3.so" python/python/dquant/_dquant.abi3.so
  grep -qx "/$STAGE/" .git/info/exclude 2>/dev/null || echo "/$STAGE/" >>.git/info/exclude
  du -sh "$STAGE"
}

measure() {
  local out="$1"
  shift
  [[ -x "$STAGE/dquant" ]] || { echo "no $STAGE/dquant: run 'bench/gpu/run.sh prepare' first" >&2; exit 2; }
  nvidia-smi -L
  PYTHONPATH="$STAGE/python" PYTHONUNBUFFERED=1 python3 bench/gpu/feed.py --out "$out" \
    --dquant-bin "$STAGE/dquant" "$@"
}

record() {
  local dir="$1" figures
  figures="$(mktemp)"
  python3 bench/gpu/figures.py "$dir/results.json" "$figures"
  python3 bench/results.py record gpu_feed --figures "$figures" \
    --title "Batches into GPU memory: dquant's loaders on a trainer host with a GPU, against the host-to-device copies alone, and DataLoader workers with the cores they need" \
    --command "bench/gpu/run.sh prepare; bash bench/gpu/run.sh measure OUT (on the GPU host); bench/gpu/run.sh record OUT" \
    --machine "$(python3 bench/gpu/figures.py --machine "$dir/results.json")" \
    --notes "$(python3 bench/gpu/figures.py --notes "$dir/results.json")"
  rm -f "$figures"
  { printf '\n## %s: gpu_feed\n\n- Machine: %s\n\n' "$(date -u +%Y-%m-%dT%H:%MZ)" \
      "$(python3 bench/gpu/figures.py --machine "$dir/results.json")"
    python3 bench/gpu/figures.py --table "$dir/results.json"; } >>bench/history/gpu_feed.md
}

case "${1:-}" in
  prepare) prepare ;;
  measure) shift; [[ $# -ge 1 ]] || { echo "usage: bench/gpu/run.sh measure OUT [feed.py options]" >&2; exit 2; }; measure "$@" ;;
  record) [[ $# -eq 2 ]] || { echo "usage: bench/gpu/run.sh record DIR" >&2; exit 2; }; record "$2" ;;
  -h|--help|"") sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; [[ -n "${1:-}" ]] ;;
  *) echo "bench/gpu/run.sh: unknown step '$1' (prepare, measure OUT, record DIR)" >&2; exit 2 ;;
esac
