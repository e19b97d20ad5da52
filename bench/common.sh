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

# Drops each FILE's clean pages from the page cache (POSIX_FADV_DONTNEED): the next read
# comes from the disk.
drop_from_cache() {
  python3 -c 'import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)' "$@"
}

# Drops FILE's pages from the page cache (POSIX_FADV_DONTNEED) and reads it back in order,
# so that every run measures a file cached the same way.
#
# Why: how a file came into the page cache sets how fast it is read from there. Read in
# order, it is cached in 2 MiB folios and `cat` copies it 3x faster than after a shuffled
# first read left it in 4 KiB ones; dquant's reads move with it (docs/benchmarks.md, "the
# page cache's folios"). Without this a recording's rates, and its ratios to a page-cache
# copy, depended on which way its dataset last came in. In order is the state a corpus read
# once front to back, or warmed by `cat` or `vmtouch`, is in. Logs FileHugePages before and
# after to stderr: it rises by about the file's size when the large folios are there.
cache_in_order() {
  local f before dropped after
  for f in "$@"; do
    before="$(awk '/^FileHugePages:/ {print $2}' /proc/meminfo)"
    drop_from_cache "$f"
    dropped="$(awk '/^FileHugePages:/ {print $2}' /proc/meminfo)"
    cat "$f" > /dev/null
    after="$(awk '/^FileHugePages:/ {print $2}' /proc/meminfo)"
    echo "== page cache: $f dropped and read back in order; FileHugePages $before kB," \
      "$dropped dropped, $after read back" >&2
  done
}

# Generates DATA/zipf256m_int32 (256 Mi Zipf token ids, 1 GiB, Megatron int32) with the
# dquant binary DQ unless it is there, and caches it in order (cache_in_order); prints its
# prefix.
zipf256m() {
  local data="$1" dq="$2" ds="$1/zipf256m_int32"
  if [[ ! -f "$ds.bin" || ! -f "$ds.idx" ]]; then
    echo "== generating $ds" >&2
    "$dq" corpus zipf "$ds" --tokens 268435456 --vocab 50257 --eod 50256 -q >&2
  fi
  cache_in_order "$ds.bin"
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
  cache_in_order "$ds.bin"
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
