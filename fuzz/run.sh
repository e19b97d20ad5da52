#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer's coverage instrumentation on a stable toolchain and
# runs them: `smoke` (CI: every target for a few seconds), `campaign` (long runs, one target
# after another) or `build` (build only). See README.md for why it works this way.
#
#   fuzz/run.sh replay                     each target over its seeds only, no mutation (CI)
#   fuzz/run.sh smoke [SECONDS]            each target SECONDS (default 6)
#   fuzz/run.sh campaign RUNS [TARGET...]  each target RUNS executions, or FUZZ_MAX_TIME s;
#                                          its log in fuzz/logs/<target>.log (not kept), its
#                                          summary in fuzz/runs/<time>-<target>.json (kept)
#   fuzz/run.sh record RUNS                the figures of the newest RUNS-run summaries
#                                          (fuzz/runs) into bench/results/fuzz.json
#   fuzz/run.sh build
#   FUZZ_TARGETS="hello plan_json" fuzz/run.sh smoke   a subset
#
# Corpora grow in fuzz/corpus/<target> (ignored by git), seeded from fuzz/seeds/<target>;
# crashes land in fuzz/artifacts/<target>/.
set -euo pipefail

# Called by cargo as the rustc wrapper (see `build`): instrument dquant's own crates only.
if [ "${DQUANT_FUZZ_WRAP:-}" = 1 ]; then
  rustc=$1
  shift
  crate=
  prev=
  for a in "$@"; do
    [ "$prev" = --crate-name ] && crate=$a
    prev=$a
  done
  case "$crate" in
    dquant_* | idx_parser | block_file | frame_stream | batch_records | hello | range_request | \
      ring_header | ring_answer | ring_consumer | plan_json | plan_toml | grpc_open | doc_section | chunk_sums)
      # shellcheck disable=SC2086
      exec "$rustc" "$@" $DQUANT_FUZZ_FLAGS
      ;;
  esac
  exec "$rustc" "$@"
fi

cd "$(dirname "$0")"
ALL="idx_parser block_file frame_stream batch_records hello range_request ring_header ring_answer ring_consumer plan_json plan_toml grpc_open doc_section chunk_sums"
TARGETS=${FUZZ_TARGETS:-$ALL}
host=$(rustc -vV | sed -n 's/^host: //p')
# The flags cargo-fuzz passes for `--sanitizer none`, all of them stable rustc options:
# coverage counters, their PC table and comparison tracing for libFuzzer, `cfg(fuzzing)`, and
# debug assertions with overflow checks, so that a wrapped size is a crash, as in tests.
export DQUANT_FUZZ_FLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# The campaign's optimised build, or the smoke's quicker one.
profile=fuzz
case "${1:-}" in smoke | replay) profile=fuzz-smoke ;; esac
bin=target/$host/$profile

build() {
  # `--target` keeps the flags off build scripts and proc macros (which cannot link the
  # coverage callbacks); the wrapper keeps them off third-party crates, which halves the
  # build and leaves the coverage map to the code under test.
  DQUANT_FUZZ_WRAP=1 RUSTC_WRAPPER="$PWD/run.sh" RUSTFLAGS="--cfg fuzzing" \
    cargo build --locked --profile "$profile" --target "$host" --bins
}

# Runs one target over its corpus (new inputs kept there) and its seeds.
run() {
  local t=$1
  shift
  mkdir -p "corpus/$t" "artifacts/$t"
  "$bin/$t" "corpus/$t" "seeds/$t" -artifact_prefix="artifacts/$t/" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 "$@"
}

case "${1:-}" in
  build)
    build
    ;;
  smoke)
    secs=${2:-6}
    build
    for t in $TARGETS; do
      log=$(mktemp)
      # Quiet unless it fails: then the whole report (the panic, the input it wrote).
      if ! run "$t" -max_total_time="$secs" >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz smoke: $t failed; the input is in fuzz/artifacts/$t/" >&2
        exit 1
      fi
      echo "fuzz smoke: $t: $(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') runs in ${secs} s, corpus $(ls "corpus/$t" | wc -l) inputs"
      rm -f "$log"
    done
    ;;
  replay)
    # Every seed of every target, executed once and checked: a parser change that fails on a
    # known input (a seed, or a crash kept as a seed) fails here, deterministically.
    build
    for t in $TARGETS; do
      log=$(mktemp)
      if ! "$bin/$t" -runs=0 -timeout=10 -rss_limit_mb=2048 "seeds/$t" >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz replay: $t failed on a seed in fuzz/seeds/$t/" >&2
        exit 1
      fi
      echo "fuzz replay: $t: $(ls "seeds/$t" | wc -l) seeds pass"
      rm -f "$log"
    done
    ;;
  campaign)
    runs=${2:?campaign needs a run count}
    shift 2
    build
    # shellcheck disable=SC2086
    [ $# -gt 0 ] || set -- $TARGETS
    mkdir -p logs
    for t in "$@"; do
      status=0
      {
        echo "== fuzz campaign: $t ($runs runs) $(date -u +%FT%TZ)"
        run "$t" -runs="$runs" ${FUZZ_MAX_TIME:+-max_total_time=$FUZZ_MAX_TIME} 2>&1
      } | tee "logs/$t.log" || status=$?
      # The run's summary, kept in git (fuzz/runs/), whether it passed or not: the log is not.
      python3 figures.py summary "$t" "logs/$t.log" --runs "$runs" --corpus "corpus/$t" ||
        status=1
      if [ "$status" != 0 ]; then
        echo "fuzz campaign: $t failed (exit $status); its inputs are in fuzz/artifacts/$t/" >&2
        exit 1
      fi
    done
    echo "commit the summaries in fuzz/runs/, then record the figures with: fuzz/run.sh record $runs"
    ;;
  record)
    runs=${2:?record needs the run count of the campaign}
    figures=$(mktemp)
    # Each target's newest summary of a campaign of that many runs (fuzz/runs/).
    # shellcheck disable=SC2086
    python3 figures.py figures --runs "$runs" $TARGETS >"$figures"
    # shellcheck disable=SC2086
    machine=$(python3 figures.py machine --runs "$runs" $TARGETS)
    # depends_on (fuzz/ and the crates the targets link) comes from bench/results.py's RUNS.
    python3 ../bench/results.py record fuzz --figures "$figures" \
      --command "fuzz/run.sh campaign $runs (targets in two lanes), then fuzz/run.sh record $runs" \
      --title "Fuzz campaign: every parser of untrusted bytes" --machine "$machine"
    rm -f "$figures"
    ;;
  *)
    sed -n '2,17p' "$0" >&2
    exit 2
    ;;
esac
