#!/usr/bin/env bash
# Megatron equivalence coverage (issue 70): runs python/tests/test_megatron_order.py, which
# compares dquant.megatron with Megatron-Core's own builder config by config, and records how
# many configs and samples it compared (bench/megatron/compared.py) as the
# `megatron_equivalence` area, which the README quotes through generated blocks.
#
# Usage:
#   bench/megatron/equivalence.sh             # about 2 min after python/test.sh's build
#   bench/megatron/equivalence.sh --no-record
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
RECORD=1
[ "${1:-}" = "--no-record" ] && RECORD=0

coverage=$(mktemp --suffix .jsonl)
figures=$(mktemp --suffix .json)
trap 'rm -f "$coverage" "$figures"' EXIT
DQUANT_MEGATRON_COVERAGE="$coverage" python/test.sh tests/test_megatron_order.py
python3 bench/megatron/compared.py "$coverage" --figures "$figures"
cat "$figures"
if [ "$RECORD" = 1 ]; then
  python3 bench/results.py record megatron_equivalence --figures "$figures" \
    --command "bench/megatron/equivalence.sh" \
    --title "Megatron equivalence: what the tests compared with Megatron-Core's builder" \
    --notes "Counts, not timings: each config of python/tests/test_megatron_order.py is built by Megatron-Core's BlendedMegatronDatasetBuilder and by dquant.megatron, and whole sample dicts are compared at every index or at distinct random indices plus the first and last of each split."
fi
