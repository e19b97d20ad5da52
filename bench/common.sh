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
