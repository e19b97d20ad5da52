# Shell pieces the bench scripts share: `source "$REPO/bench/common.sh"`.
#
# Why: share/run.sh, cost/run.sh, offload/run.sh and scale/run.sh each wrote the machine's
# description and generated the same Zipf dataset, in copies that had started to differ.

# Writes what machine and commit a run is on to stdout and to FILE (its machine.txt).
machine_info() {
  local file="$1"
  {
    echo "date:    $(date -u)"
    echo "nproc:   $(nproc)"
    echo "cpu:     $(lscpu | grep 'Model name' | sed 's/.*: *//')"
    echo "memory:  $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
    echo "commit:  $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "dirty:   $(git status --porcelain -- crates bench/harness 2>/dev/null | tr '\n' ' ')"
    echo "load before: $(uptime)"
  } | tee "$file"
}

# Generates DATA/zipf256m_int32 (256 Mi Zipf token ids, 1 GiB, Megatron int32) with the
# dquant binary DQ unless it is there; prints its prefix.
zipf256m() {
  local data="$1" dq="$2" ds="$1/zipf256m_int32"
  if [[ ! -f "$ds.bin" || ! -f "$ds.idx" ]]; then
    echo "== generating $ds" >&2
    "$dq" corpus zipf "$ds" --tokens 268435456 --vocab 50257 --eod 50256 -q >&2
  fi
  echo "$ds"
}

# DATA/zipf256m_u16: zipf256m_int32 converted to Megatron uint16 (512 MiB; batches in u16 are
# then copied from the file, no narrowing), made once with the dquant binary DQ; prints its
# prefix.
zipf256m_u16() {
  local data="$1" dq="$2" ds="$1/zipf256m_u16"
  local src
  src="$(zipf256m "$data" "$dq")"
  if [[ ! -f "$ds.bin" || ! -f "$ds.idx" ]]; then
    echo "== converting $src to $ds (uint16)" >&2
    "$dq" convert "$src" "$ds" --codec u16 -q >&2
  fi
  echo "$ds"
}

# The options bench/<area>/run.sh scripts share, from "$@": sets RECORD (an array, (--record)
# or empty), RUNS (when --runs N is given; keep the caller's default otherwise) and ARGS (the
# rest); --help prints the comment block at the top of SCRIPT and exits.
#   bench_args SCRIPT "$@"
bench_args() {
  local script="$1"; shift
  RECORD=()
  ARGS=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --record) RECORD=(--record); shift ;;
      --runs|--rounds) RUNS="$2"; shift 2 ;;
      -h|--help) sed -n '2,/^set -euo/p' "$script" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) ARGS+=("$1"); shift ;;
    esac
  done
}

# Builds the release binaries the scripts run: the harness (dquant-offload-bench) and dquant.
build_release() {
  echo "== building (release)"
  cargo build --release --locked -q -p dquant-bench -p dquant-cli
}
