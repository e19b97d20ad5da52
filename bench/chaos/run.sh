#!/usr/bin/env bash
# The chaos soak (issue 35), in one command: three replicas, a host agent chained to them
# and readers through it, on loopback, with a fault every 0.3-1.5 s (SIGKILL of a replica
# while another serves, SIGKILL or SIGTERM of the host agent, SIGKILL of a reader) for
# --minutes; the third replica's copy has flipped bits that its chunk sums must catch. Every
# reader's stream is checked against the plan read locally, byte for byte, and every reader
# error is classed by its cause from the fault log (bench/chaos/verdict.py): exit status 1
# when a stream differs, an error is unexplained or a replica fault's, a reader resumed more
# than once for one host-agent fault or never finished a pass, no read met the flipped bits,
# or (under CI=true) no replica link could be cut. See bench/chaos/chaos.py.
#
# Usage:
#   bench/chaos/run.sh --minutes 2                 # what CI runs
#   bench/chaos/run.sh --minutes 30 --record       # the run bench/RESULTS.md records
#   bench/chaos/run.sh --help                      # every option
#
# Builds the release binary, generates two Zipf corpora once into /var/tmp/dquant-chaos
# (--data to move them), and writes report.json, figures.json, the agents' logs and the
# readers' errors to bench/chaos/out/<UTC time>/. --record also records the figures in
# bench/results/chaos.json (bench/results.py; RESULTS.md rendered again).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
for a in "$@"; do
  if [[ "$a" == -h || "$a" == --help ]]; then exec python3 bench/chaos/chaos.py --help; fi
done
# The same packages as the lab builds, so that one build serves both (CI runs the two).
cargo build --release --locked -q -p dquant-cli -p dquant-bench
OUT="$REPO/bench/chaos/out/$(date -u +%Y%m%dT%H%M%SZ)"
RECORD=0
ARGS=()
for a in "$@"; do
  if [[ "$a" == --record ]]; then RECORD=1; else ARGS+=("$a"); fi
done
# The Python reader needs the test venv with dquant and torch (python/test.sh makes it, the
# first time in minutes); --python-readers 0 leaves it out.
PY=()
if [[ " $* " != *" --python-readers 0 "* ]]; then
  PY=(--python "$(python/test.sh --no-tests | tail -n 1)")
fi
python3 bench/chaos/chaos.py --dquant "$REPO/target/release/dquant" --out "$OUT" "${PY[@]}" "${ARGS[@]}"
if [[ $RECORD == 1 ]]; then
  python3 bench/results.py record chaos --figures "$OUT/figures.json" \
    --command "bench/chaos/run.sh $*" \
    --title "Chaos soak: replicas, a host agent and readers under SIGKILL and SIGTERM"
fi
