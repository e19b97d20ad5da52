#!/usr/bin/env bash
# The benchmark lab, in one command (as root): a storage node and a training host in two
# network namespaces joined by a veth pair shaped with tc tbf, and the same real tokenized
# corpora read across it four ways: (a) S3 int32 + host-side narrowing (today's baseline),
# (b) a near-storage dquant agent, (c) a DPU-style chain of two agents and a shared-memory
# ring, (d) in-process on local files. See bench/lab/README.md.
#
# Usage:
#   sudo bench/lab/run.sh [LAB OPTIONS]        # e.g. --rate 1gbit --size 200 --runs 3
#   sudo bench/lab/run.sh --smoke              # tiny data, one run, ~30 s: what CI runs
#   sudo bench/lab/run.sh --tenants --corpora r50k   # tenants with bandwidth guarantees (~30 s; the lab_tenants area)
#   sudo bench/lab/run.sh --cleanup            # remove namespaces a killed lab left behind
#   bench/lab/run.sh --help                    # every option
#
# It installs what it needs (iproute2, fonts for the chart, s3s-fs 0.14.1 from crates.io),
# builds the release binaries, and runs `dquant-offload-bench lab`. A full run records its
# figures in bench/results/lab.json (bench/results.py; RESULTS.md rendered again), appends its
# table to bench/history/lab.md and copies its chart to bench/lab/latest.png (--no-append skips
# all three); results also go to bench/lab/out/<UTC time>/ (table.md, results.json,
# figures.json, lab.png). A tenants run records bench/results/lab_tenants.json instead (its
# out/ directory holds table.md and figures.json).
# Corpora are generated once into /var/tmp/dquant-lab (--data to move them).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
S3S_VERSION=0.14.1

ARGS=()
SMOKE=0
APPEND=1
HELP=0
for a in "$@"; do
  case "$a" in
    --smoke) SMOKE=1; ARGS+=("$a") ;;
    --no-append) APPEND=0 ;;
    --cleanup) APPEND=0; ARGS+=("$a") ;;
    -h|--help) HELP=1; ARGS+=("$a") ;;
    *) ARGS+=("$a") ;;
  esac
done

if [[ $HELP == 0 && $EUID -ne 0 ]]; then
  echo "bench/lab/run.sh: the lab creates network namespaces and must run as root: sudo $0 $*" >&2
  exit 1
fi

apt_install() {
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  else
    echo "bench/lab/run.sh: please install $* (no apt-get here)" >&2
    exit 1
  fi
}
if [[ $HELP == 0 ]]; then
  command -v ip >/dev/null && command -v tc >/dev/null || apt_install iproute2
  test -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf || apt_install fonts-dejavu-core
  CARGO_BIN="${CARGO_HOME:-$HOME/.cargo}/bin"
  if ! "$CARGO_BIN/s3s-fs" --version 2>/dev/null | grep -q "$S3S_VERSION"; then
    echo "bench/lab/run.sh: installing s3s-fs $S3S_VERSION (the baseline's S3 server) from crates.io" >&2
    cargo install s3s-fs --version "$S3S_VERSION" --locked --features binary
  fi
  export PATH="$CARGO_BIN:$PATH"
fi

cargo build --release --locked -q -p dquant-cli -p dquant-bench

OUT="$REPO/bench/lab/out/$(date -u +%Y%m%dT%H%M%SZ)"
# What the lab_tenants area's figures stand on (bench/results.py shows it beside them).
TENANTS_NOTES="Link: veth + tc tbf (the run's --rate and --mtu, 1gbit and 1500 by default), namespaces storage → host, the storage side's egress an HTB tree with one class per tenant by DSCP (its guarantee as rate, the link as ceiling), run once with the classes holding the guarantees and once with them only counting (the shares then the agent's scheduler's alone); greedy consumers of an unshuffled u16 plan (seq_len 4095, batch 16) over TCP. The run's section in bench/history/lab.md gives the corpus and the bytes each class sent."
EXTRA=()
if [[ $HELP == 0 ]]; then
  EXTRA+=(--out "$OUT")
  if [[ $SMOKE == 0 && $APPEND == 1 ]]; then EXTRA+=(--append "$REPO/bench/history/lab.md"); fi
fi
export DQUANT_LAB_COMMAND="bench/lab/run.sh${*:+ $*}"
target/release/dquant-offload-bench lab "${ARGS[@]}" "${EXTRA[@]}"
TENANTS=0
for a in "${ARGS[@]}"; do [[ "$a" == --tenants ]] && TENANTS=1; done
if [[ $HELP == 0 && $SMOKE == 0 && $APPEND == 1 && $TENANTS == 1 && -f "$OUT/figures.json" ]]; then
  python3 bench/results.py record lab_tenants --figures "$OUT/figures.json" --command "$DQUANT_LAB_COMMAND" \
    --notes "$TENANTS_NOTES"
  echo "bench/lab/run.sh: figures in bench/results/lab_tenants.json, table in bench/history/lab.md" >&2
elif [[ $HELP == 0 && $SMOKE == 0 && $APPEND == 1 && -f "$OUT/figures.json" ]]; then
  # The servers' CPU per token comes from bench/harness/src/procs.rs.
  python3 bench/results.py record lab --figures "$OUT/figures.json" --command "$DQUANT_LAB_COMMAND"
  cp "$OUT/lab.png" "$REPO/bench/lab/latest.png"
  echo "bench/lab/run.sh: figures in bench/results/lab.json, table in bench/history/lab.md, chart at bench/lab/latest.png" >&2
fi
