#!/usr/bin/env python3
"""The tls area's figures from one `dquant-offload-bench throughput` JSON (bench/tls/run.sh):
each ratio is taken within a run (TLS against the same run's plaintext agent or plain copy),
and the worst run's is the figure (the lowest throughput, the highest CPU), with the range
beside it. Prints a Markdown table; --record writes bench/results/tls.json and appends the
table to bench/history/tls.md. Standard library only."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
from benchlib import figures_table, history_head, spread  # noqa: E402


def by_run(ms: list[dict]) -> dict[int, dict[str, dict]]:
    runs: dict[int, dict[str, dict]] = {}
    for m in ms:
        runs.setdefault(m["run"], {})[m["case"]] = m
    return runs


def rng(xs: list[float], fmt: str = "{:.3f}") -> str:
    return spread(xs, fmt.format)


def figures(ms: list[dict]) -> list[dict]:
    runs = list(by_run(ms).values())
    out = []
    for shuf, tcp_key, tls_key in [("false", "agent", "agent-tls"), ("true", "agent-shuffled", "agent-tls-shuffled")]:
        tcp = [r[tcp_key] for r in runs]
        tls = [r[tls_key] for r in runs]
        plain_name = "plaintext agent" + (" shuffled" if shuf == "true" else "")
        rate = [t["gb_per_s"] / p["gb_per_s"] for t, p in zip(tls, tcp)]
        out.append({
            "name": f"agent TLS, shuffle={shuf}: throughput vs plaintext agent (worst of {len(runs)} runs)",
            "value": round(min(rate), 3), "unit": "×",
            "baseline": f"{plain_name}, same run: {rng([p['gb_per_s'] for p in tcp])} GB/s; "
                        f"TLS {rng([t['gb_per_s'] for t in tls])} GB/s, ratio {rng(rate)}",
            "goal": None})
        if shuf == "false":
            plain = [r["plain"]["gb_per_s"] for r in runs]
            to_plain = [t["gb_per_s"] / p for t, p in zip(tls, plain)]
            agent_plain = [a["gb_per_s"] / p for a, p in zip(tcp, plain)]
            out.append({
                "name": f"agent TLS, shuffle=false: throughput vs plain TCP copy (worst of {len(runs)} runs)",
                "value": round(min(to_plain), 3), "unit": "×",
                "baseline": f"plain TCP copy, same run: {rng(plain)} GB/s; ratio {rng(to_plain, '{:.2f}')} "
                            f"(plaintext agent {rng(agent_plain, '{:.2f}')})",
                "goal": None})
        for side, key in [("consumer", "consumer_cpu_s_per_gb"), ("agent", "peer_cpu_s_per_gb")]:
            r = [t[key] / p[key] for t, p in zip(tls, tcp)]
            out.append({
                "name": f"agent TLS, shuffle={shuf}: {side} CPU per GB vs plaintext agent (worst of {len(runs)} runs)",
                "value": round(max(r), 3), "unit": "×",
                "baseline": f"{plain_name}, same run: {rng([p[key] for p in tcp])} CPU-s/GB; "
                            f"TLS {rng([t[key] for t in tls])}, ratio {rng(r)}",
                "goal": None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="dquant-offload-bench throughput --json-out FILE")
    ap.add_argument("--command", default="bench/tls/run.sh")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    doc = json.loads(Path(a.json).read_text())
    fs = figures(doc["measurements"])
    table = figures_table(fs)
    print(table)
    if not a.record:
        return
    head = history_head("what TLS costs on the data plane", a.command,
                        f"{Path(doc['dataset']).name} ({doc['plan']}).")
    notes = ("agent-tls is the same plan on a second agent process serving TLS on both planes (rustls, TLS 1.3, "
             "certificates made per run), read with Reader::remote_with trusting its CA. Ratios are to the same "
             "run's plaintext agent or plain TCP copy, each the worst run's (the lowest throughput, the highest "
             "CPU), with the range in the baseline. There is no target; kernel TLS (kTLS), the way to close the "
             "gap, is not measured: the VM's kernel has no tls ULP.")
    if not benchlib.record("tls", fs, a.command, head + table + "\n\n",
                           "--notes", "Dataset " + Path(doc["dataset"]).name + f" ({doc['plan']}). " + notes):
        sys.exit("bench/tls/figures.py: the figures were not recorded (above: why)")


if __name__ == "__main__":
    main()
