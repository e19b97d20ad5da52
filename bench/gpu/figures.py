#!/usr/bin/env python3
"""The gpu_feed area's figures, notes and machine line from bench/gpu/feed.py's results.json
(standard library only: it runs here, where the results are recorded).

    figures.py RESULTS OUT      write {"figures": [...]} for bench/results.py record
    figures.py --notes RESULTS  print the area's notes
    figures.py --machine RESULTS
"""

from __future__ import annotations

import json
import re
import sys

BASE = "in-process, dquant DataLoader (no workers, pin_memory)"
LIMIT = "limit: pinned batches copied to the GPU"
STAGED = "in-process, dquant DataLoader (no workers), staged in 3 reused pinned buffers"


def rows(doc: dict) -> dict[str, dict]:
    return {r["row"]: r for r in doc["rows"]}


def rate(r: dict) -> str:
    return f"{r['tokens_s'] / 1e6:,.0f} M tokens/s, {r['cpu_ns_token']:.2f} CPU ns/token"


def figures(doc: dict) -> list[dict]:
    by = rows(doc)
    base, limit = by[BASE], by[LIMIT]
    out = [{
        "name": "in-process (no workers, pin_memory) into GPU memory: rate ÷ the copies alone",
        "value": round(base["tokens_s"] / limit["tokens_s"], 3), "unit": "×",
        "baseline": f"pinned batches of the same shapes copied to the GPU, same run: {rate(limit)}",
        "goal": None,
    }]
    staged = by.get(STAGED)
    if staged is not None:
        out.append({
            "name": "in-process, batches staged in reused pinned buffers (what batches made in "
                    "pinned memory would give): rate ÷ in-process with torch's pin_memory",
            "value": round(staged["tokens_s"] / base["tokens_s"], 3), "unit": "×",
            "baseline": f"{BASE}, same run: {rate(base)}; staged {rate(staged)}",
            "goal": None,
        })
    for name, r in by.items():
        if name.startswith("in-process, dquant DataLoader (no workers, device="):
            out.append({
                "name": f"in-process (no workers) with {name[name.index('device='):-1]}, the loader's "
                        "own copy to the device: rate ÷ in-process with torch's pin_memory",
                "value": round(r["tokens_s"] / base["tokens_s"], 3), "unit": "×",
                "baseline": f"{BASE}, same run: {rate(base)}; this row {rate(r)}",
                "goal": None,
            })
    for name, r in by.items():
        m = re.match(r"(dquant DataLoader|torch DataLoader \+ TokenDataset|agent over shm, dquant "
                     r"DataLoader), (\d+) (worker|session)", name)
        if not m:
            continue
        agent = name.startswith("agent")
        out.append({
            "name": f"{name}, into GPU memory: rate ÷ in-process with no workers",
            "value": round(r["tokens_s"] / base["tokens_s"], 3), "unit": "×",
            "baseline": f"{BASE}, same run: {rate(base)}; this row {rate(r)}",
            # The worker goal (never below the in-process rate) is for workers, not
            # an agent's sessions.
            "goal": None if agent else ">= 1.0",
        })
    return out


def notes(doc: dict) -> str:
    a, m = doc["args"], doc["machine"]
    return (
        f"Plan: a raw int32 corpus of {a['tokens']:,} Zipf ids (below 50,257), seq_len "
        f"{a['seq_len']}, batch {a['batch_size']}, unshuffled, output i64; every batch's "
        "input_ids and labels are copied to the GPU (non_blocking) in the loop. Each row's rate "
        f"is the best of {a['runs']} runs of whole passes for at least {a['min_run_s']} s, each "
        "pass ended by a device synchronize. Before them, an untimed pass of each row put the "
        "plan's samples in GPU memory: a digest computed on the GPU from the copied tensors "
        "equalled the one computed from the corpus. "
        "CPU per token is the loop's process (its pin-memory thread included), its worker "
        "processes and the agent. "
        f"Machine: {m['gpu']}; {m['cores']} cores ({m['cpu']}); torch {m['torch']}, Python "
        f"{m['python']}. The whole table: bench/history/gpu_feed.md."
        + diagnostics(doc.get("diagnostics") or {})
    )


def diagnostics(d: dict) -> str:
    if not d:
        return ""
    return (
        " One (batch, seq_len) int64 tensor, microseconds each, same run: torch's pin_memory() "
        f"{d['pin_memory_us']}, a copy into a pinned tensor kept {d['copy_into_pinned_us']}, "
        f"to the device from pageable memory {d['h2d_pageable_us']} and from pinned memory "
        f"{d['h2d_pinned_us']} (each followed by a synchronize)."
    )


def machine(doc: dict) -> str:
    m = doc["machine"]
    return f"{m['gpu']}; {m['cores']} cores {m['cpu']}"


def table(doc: dict) -> str:
    lines = ["| row | M tokens/s into GPU memory | runs | CPU ns/token |", "|---|---:|---|---:|"]
    for r in doc["rows"]:
        runs = ", ".join(f"{x / 1e6:,.0f}" for x in r["runs"])
        lines.append(f"| {r['row']} | {r['tokens_s'] / 1e6:,.0f} | {runs} | {r['cpu_ns_token']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] in ("--notes", "--machine", "--table"):
        doc = json.load(open(argv[1]))
        print({"--notes": notes, "--machine": machine, "--table": table}[argv[0]](doc))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    doc = json.load(open(argv[0]))
    with open(argv[1], "w") as f:
        json.dump({"figures": figures(doc)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
