#!/usr/bin/env python3
"""What python/tests/test_megatron_order.py compared with Megatron-Core's own builder, as the
figures of the `megatron_equivalence` area: read from the coverage lines the test module
writes to $DQUANT_MEGATRON_COVERAGE (one JSON object per config: its splits' lengths and how
many indices of each it compared). The README quotes these through generated blocks, so the
claim "compared over N configs" is the count the tests made, never a typed number.

    compared.py COVERAGE.jsonl --figures OUT.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

AT_LEAST = 100


def nonempty(rec: dict) -> list[tuple[int, int]]:
    """A record's (samples, compared) for each split with samples."""
    return [(n, c) for n, c in zip(rec["splits"], rec["compared"]) if n]


def covered(rec: dict, at_least: int = AT_LEAST) -> bool:
    """Whether every non-empty split of a recorded config compared ``at_least`` indices."""
    return all(c >= at_least for _, c in nonempty(rec))


def whole(rec: dict) -> bool:
    """Whether a recorded config compared every index of every split."""
    return all(c == n for n, c in nonempty(rec))


def each_split(rec: dict) -> bool:
    """Whether every non-empty split compared AT_LEAST indices, or all it has when fewer."""
    return all(c >= min(n, AT_LEAST) for n, c in nonempty(rec))


def figures(records: list[dict]) -> list[dict]:
    covered_ = [r for r in records if covered(r)]
    whole_ = [r for r in records if whole(r)]
    either = [r for r in records if each_split(r)]
    random_ = [r for r in records if r["test"].endswith("::test_random_configs")]
    samples = sum(c for r in records for c in r["compared"] if c)

    def fig(name, value, unit, baseline):
        return {"name": name, "value": value, "unit": unit, "baseline": baseline, "goal": None}

    configs = {r["config"] for r in records}
    return [
        fig("configs compared with Megatron-Core's builder", len(configs), "configs",
            "every config of test_megatron_order.py that both sides build"),
        fig("comparisons (a config built both ways, in-process or through an agent)",
            len(records), "comparisons", "the configs compared"),
        fig(f"comparisons whose every non-empty split compared {AT_LEAST} or more indices",
            len(covered_), "comparisons", "the comparisons"),
        fig("comparisons at every index of every split", len(whole_), "comparisons",
            "the comparisons"),
        fig(f"comparisons whose every non-empty split compared {AT_LEAST} indices or all it has",
            len(either), "comparisons", "the comparisons"),
        fig("configs drawn at random and compared", len(random_), "configs",
            "test_random_configs' seeded draw"),
        fig(f"configs drawn at random whose every non-empty split compared {AT_LEAST} or more "
            "indices", len([r for r in random_ if covered(r)]), "configs",
            "the configs drawn at random and compared (test_random_configs asserts it)"),
        fig("samples compared (whole dicts)", samples, "samples", "all configs"),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("coverage", type=Path)
    p.add_argument("--figures", type=Path, required=True)
    a = p.parse_args()
    records = [json.loads(line) for line in a.coverage.read_text().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"{a.coverage}: no coverage records (did the tests run?)")
    a.figures.write_text(json.dumps({"figures": figures(records)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
