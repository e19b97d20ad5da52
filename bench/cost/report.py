#!/usr/bin/env python3
"""The cost report from what bench/cost/run.sh measured: CPU-ns per token for the agent and
the host on each path, beside the limit measured in the same run; the producer's stages; and
how many trainer GPUs at 10,000 tokens/s one agent core feeds. Writes OUT/report.md (and
prints it); with --record, the figures go to bench/results/cost.json.

    bench/cost/report.py OUT_DIR --dataset PREFIX --command CMD --fanout-samples N [--record]

Why a ratio and a count of GPUs: a GPU needs thousands of tokens a second, so what dquant
saves is CPU (the host's, a storage node's, a DPU's ARM cores), and the yardstick is cost per
token against the physical limit, not raw GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402

GPU_TOKENS_PER_S = 10_000

# path -> (throughput case, the limit case it is held to, the goal for rate ÷ limit)
PATHS = [
    ("local (in-process)", "inproc", "pagecache", None),
    ("local, shuffled", "inproc-shuffled", "pagecache", None),
    ("shm (agent, ring)", "agent-shm", "pagecache", 0.8),
    ("shm, shuffled", "agent-shm-shuffled", "pagecache", 0.7),
    ("TCP (agent)", "agent", "plain", 0.8),
    ("TCP, shuffled", "agent-shuffled", "plain", None),
    ("TLS (agent)", "agent-tls", "plain", None),
    ("TLS, shuffled", "agent-tls-shuffled", "plain", None),
    ("chain (host agent ← storage agent over TCP; both agents' CPU)", "agent-chain", "plain", None),
    ("chain, shuffled", "agent-chain-shuffled", "plain", None),
    ("mount (FUSE on the host; host CPU: the mount process and the reader)", "mount",
     "pagecache", None),
    ("Python loop, in-process (numpy batches)", "python", "pagecache", None),
    ("Python loop, agent over shm", "python-shm", "pagecache", None),
]
LIMITS = {
    "pagecache": "page-cache copy of the dataset's file (cat FILE > /dev/null)",
    "plain": "plain TCP copy of the same bytes (a sender process, 1 MiB writes)",
    "memcpy": "memcpy of the same bytes, batch by batch, one thread",
}

# The producer's stages (bench `breakdown`), in the data path's order: the name, and
# the breakdown rows (by the start of their names) that make it up.
STAGES = [
    ("read", ["of which: pread of the stored bytes"]),
    ("narrow", ["Dataset::read_into after the pread", "check_fits for the output dtype"]),
    ("blend/pack", ["Pipeline own work", "LocalSource loop around"]),
    ("encode (compress with a compressing codec)",
     ["codec choice + wire check + encode", "encode_width into 1 MiB frames"]),
    ("frame+crc", ["crc32c of each frame", "FrameSink copy into 1 MiB frames"]),
    ("hand-off (host: frame → batch buffer)", ["copy frame → batch buffer"]),
]
# Where a DPU's engines would take a stage off its cores. NVIDIA's BlueField-2 compresses and
# decompresses DEFLATE; BlueField-3 only decompresses, DEFLATE and LZ4 (DOCA Compress; DPDK's
# mlx5 compress driver: LZ4 windows up to 32 KB). Neither has a zstd engine. Both compute
# CRCs, DMA into host memory and do RDMA.
DPU = {
    "read": "NVMe/storage DMA into the DPU's memory; a compressed source's blocks: "
            "BlueField-3's LZ4/DEFLATE decompression engine (`--preset dpu`, below)",
    "frame+crc": "crc32c: the NIC's CRC offload",
    "encode (compress with a compressing codec)":
        "BlueField-2's DEFLATE engine; BlueField-3 compresses nothing, so the ARM cores "
        "(store compressed instead, and send plain or narrowed)",
    "send": "RDMA write into the host's registered buffer: no socket, no copy",
    "hand-off (host: frame → batch buffer)": "the host's CPU, not the DPU's",
}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def cases(path: Path) -> dict:
    """Per throughput case, medians over its runs: tokens/s and CPU ns/token of the consumer
    (this host) and the peer (the agent, or the plain copy's sender)."""
    doc = json.loads(path.read_text())
    by: dict = {}
    for m in doc["measurements"]:
        by.setdefault(m["case"], []).append(m)
    out = {}
    for case, ms in by.items():
        ns = lambda key: median([m[key] * 1e9 / m["tokens"] for m in ms if m[key] is not None])
        out[case] = {
            "rate": median([m["tokens"] / m["seconds"] for m in ms]),
            "host_ns": ns("consumer_cpu_s"),
            "agent_ns": ns("peer_cpu_s") if any(m["peer_cpu_s"] is not None for m in ms) else None,
        }
    return out


def page_cache_copy(dataset: str, runs: int = 3) -> dict:
    """`cat DATASET.bin > /dev/null`, best of `runs` (the file warm): its tokens/s, and its
    CPU ns per stored token."""
    path = f"{dataset}.bin"
    tokens = os.path.getsize(path) // 4
    best = None
    for _ in range(runs):
        t0 = time.perf_counter()
        with open(os.devnull, "wb") as null:
            p = subprocess.Popen(["cat", path], stdout=null)
            _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        if status != 0:
            raise benchlib.BenchError(f"cat {path} failed: status {status}")
        cpu = ru.ru_utime + ru.ru_stime
        if best is None or wall < best[0]:
            best = (wall, cpu)
    return {"rate": tokens / best[0], "host_ns": best[1] * 1e9 / tokens, "agent_ns": None,
            "tokens": tokens}


def page_cache_limit(out: Path, dataset: str) -> dict:
    """The faster of the page-cache copies measured at the start of run.sh's runs
    (pagecache-start.json, written by --pagecache-into right after bench/common.sh cached the
    file in order) and at their end (pagecache.json, measured here once): the limit, with both
    in its note. A report made again later from the same measurements keeps the limit they
    were measured beside."""
    saved = out / "pagecache.json"
    end = json.loads(saved.read_text()) if saved.exists() else page_cache_copy(dataset)
    saved.write_text(json.dumps(end, indent=1))
    start_file = out / "pagecache-start.json"
    if not start_file.exists():
        return end
    start = json.loads(start_file.read_text())
    best = dict(max(start, end, key=lambda pc: pc["rate"]))
    best["note"] = (f"the faster of the copies at the run's start ({start['rate'] / 1e6:,.0f}) "
                    f"and end ({end['rate'] / 1e6:,.0f} M tokens/s), the file dropped from the "
                    "page cache and read back in order before the runs")
    return best


def after_shuffled(out: Path) -> dict | None:
    """The page-cache copy after the agent's shuffled pass over the file from the disk
    (pagecache-after-shuffled.json), against the copy after the file was read in order
    (pagecache-start.json), and that pass's rate (cold-shuffled.json)."""
    after, start = out / "pagecache-after-shuffled.json", out / "pagecache-start.json"
    if not (after.exists() and start.exists()):
        return None
    cold = cases(out / "cold-shuffled.json").get("agent-shm-shuffled")
    return {"after": json.loads(after.read_text())["rate"],
            "in_order": json.loads(start.read_text())["rate"],
            "cold": f"{cold['rate'] / 1e6:,.0f}" if cold else "—"}


def folios_lines(f: dict) -> list[str]:
    return [
        "### The page cache a shuffled pass leaves", "",
        "The file dropped from the page cache, one shuffled pass of the agent over shared "
        f"memory from the disk ({f['cold']} M tokens/s), then `cat FILE > /dev/null`, best of 3: "
        f"{f['after'] / 1e6:,.0f} M tokens/s, against {f['in_order'] / 1e6:,.0f} after the "
        f"file was read in order ({f['after'] / f['in_order']:.2f}×). The agent's kept maps "
        "ask for 2 MiB folios (`GuardedMap::advise_large_folios`); pages faulted in 4 KiB at "
        "a time would be copied 2-3× slower, by the agent and by anyone, on every later pass.",
        "",
    ]


def folios_figures(f: dict | None) -> list[dict]:
    if not f:
        return []
    return [{"name": "page cache after the agent's shuffled pass from the disk: page-cache "
                     "copy ÷ the copy after a read in order",
             "value": round(f["after"] / f["in_order"], 3), "unit": "×",
             "baseline": f"the copy after the file was read in order, same run: "
                         f"{f['in_order'] / 1e6:,.0f} M tokens/s (after the shuffled pass "
                         f"{f['after'] / 1e6:,.0f}; the pass itself {f['cold']} M tokens/s)",
             "goal": ">= 0.9"}]


def script_cases(out: Path) -> dict:
    """The cases the Python scripts measured, as throughput cases: the mount's whole-file read
    (bench/cost/mount.py, one case) and the Python loops (bench/cost/python.py, one a key);
    none for a script that did not run."""
    got = {}
    mount, python = out / "mount.json", out / "python.json"
    if mount.exists():
        got["mount"] = json.loads(mount.read_text())["median"]
    if python.exists():
        got.update({k: v["median"] for k, v in json.loads(python.read_text()).items()})
    return {k: {"rate": m["rate"], "agent_ns": m["agent_ns"], "host_ns": m["host_ns"]}
            for k, m in got.items()}


def stages(path: Path) -> list[tuple[str, float]]:
    doc = json.loads(path.read_text())
    rows = doc["stages"] + doc["derived"]
    out = []
    for name, prefixes in STAGES:
        ns = sum(r["ns_per_token"] for r in rows
                 if any(r["stage"].startswith(p) for p in prefixes))
        out.append((name, ns))
    total = next(r["ns_per_token"] for r in rows if r["stage"].startswith("= producer thread"))
    out.append(("= the producer thread (read to frames)", total))
    return out


def fanout(path: Path, samples: int) -> dict:
    """The agent's CPU per delivered token, one shared stream to N readers against one;
    each reader streamed `samples` samples of the plan the share bench names."""
    doc = json.loads(path.read_text())
    readers = doc["readers"]
    seq_len = int(re.search(r"seq_len (\d+)", doc["plan"]).group(1))
    per_reader = samples * (seq_len + 1)
    return {
        "shared_ns": doc["shared"]["agent_cpu_s"] * 1e9 / (readers * per_reader),
        "lone_ns": doc["lone"]["agent_cpu_s"] * 1e9 / per_reader,
        "rate_ratio": doc["shared"]["slowest_bytes_per_s"] / doc["lone"]["bytes_per_s"],
        "readers": readers,
    }


def dpu_source(path: Path) -> dict | None:
    """The dpu preset's LZ4 blocks decoded in software (`dquant bench codecs`), beside the
    same blocks stored plain: what BlueField-3's decompression engine would take off a core."""
    if not path.exists():
        return None
    r = json.loads(path.read_text())[0]
    rows = {c["codec"]: c for c in r["codecs"]}
    ns = lambda c: 1e3 / rows[c]["decode_mtok_s"]
    return {"corpus": Path(r["path"]).name, "tokens": r["tokens"],
            "hc_ns": ns("u16+lz4hc:9"), "lz4_ns": ns("u16+lz4"), "plain_ns": ns("u16"),
            "hc_bits": rows["u16+lz4hc:9"]["bits_per_token"],
            "lz4_bits": rows["u16+lz4"]["bits_per_token"]}


def dpu_lines(d: dict) -> list[str]:
    return [
        f"### A compressed source on a DPU (`dquant convert --preset dpu`: u16+lz4hc:9 in 32 KiB "
        f"blocks; real text, {d['corpus']}, {d['tokens']:,} tokens)", "",
        "| stage | CPU ns/token | on a DPU |", "|---|---:|---|",
        f"| decode of the dpu preset's blocks, software, one core ({d['hc_bits']:.2f} "
        f"bits/token) | {d['hc_ns']:.3f} | BlueField-3's LZ4 decompression engine |",
        f"| the same blocks written by LZ4's fast parser ({d['lz4_bits']:.2f} bits/token) | "
        f"{d['lz4_ns']:.3f} | the same engine |",
        f"| the same blocks stored plain u16 (16 bits/token; a copy) | {d['plain_ns']:.3f} | "
        "DMA |",
        "",
    ]


def machine(out: Path) -> str:
    """The CPU and core count run.sh noted in OUT/machine.txt."""
    info = {}
    for line in (out / "machine.txt").read_text().splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return f"{info.get('nproc', '?')} vCPU {info.get('cpu', '')}".strip()


def gpus(ns_per_token: float | None) -> float | None:
    if not ns_per_token:
        return None
    return 1e9 / ns_per_token / GPU_TOKENS_PER_S


def path_rows(tp: dict, limits: dict) -> list[dict]:
    rows = []
    for name, case, limit, goal in PATHS:
        c, lim = tp.get(case), limits[limit] if limit in limits else tp.get(limit)
        if c is None or lim is None:
            continue
        worker = c["agent_ns"] if c["agent_ns"] is not None else c["host_ns"]
        lim_ns = (lim["agent_ns"] or 0) + lim["host_ns"]
        rows.append({
            "path": name, "case": case, "rate": c["rate"], "limit": limit,
            "limit_rate": lim["rate"], "ratio": c["rate"] / lim["rate"], "goal": goal,
            "agent_ns": c["agent_ns"], "host_ns": c["host_ns"], "limit_ns": lim_ns,
            "gpus": gpus(worker), "limit_note": lim.get("note"),
        })
    return rows


def fmt(x, spec=".2f", none="—"):
    return none if x is None else format(x, spec)


def table(rows: list[dict], title: str) -> list[str]:
    lines = [
        f"### {title}", "",
        "| path | M tokens/s | limit (same run) | rate ÷ limit | goal | agent CPU ns/token | "
        "host CPU ns/token | limit's CPU ns/token | GPUs fed per agent core |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ok = "" if r["goal"] is None else (" ✅" if r["ratio"] >= r["goal"] else " ❌")
        lines.append(
            f"| {r['path']} | {r['rate'] / 1e6:,.0f} | {r['limit']}: {r['limit_rate'] / 1e6:,.0f} "
            f"M tok/s | {r['ratio']:.2f}×{ok} | {fmt(r['goal'], '.1f')} | "
            f"{fmt(r['agent_ns'])} | {fmt(r['host_ns'])} | {r['limit_ns']:.2f} | "
            f"{fmt(r['gpus'], ',.0f')} |"
        )
    return lines + [""]


def report(out: Path, dataset: str, command: str, fanout_samples: int) -> tuple[str, list[dict]]:
    limits = {"pagecache": page_cache_limit(out, dataset)}
    tp, tp1 = cases(out / "throughput.json"), cases(out / "throughput-w1.json")
    tp.update(script_cases(out))
    tp0, zs = cases(out / "throughput-w0.json"), cases(out / "throughput-zstd.json")
    rows, rows1 = path_rows(tp, limits), path_rows(tp1, limits)
    rows0 = path_rows(tp0, limits)
    pread = out / "throughput-pread.json"
    rowsm = path_rows(cases(pread), limits) if pread.exists() else []
    tr = out / "throughput-transport.json"
    for path, cs in [("TCP, wire auto+zstd:1", zs),
                     ("TCP, wire transport (the default; real code, r50k)",
                      cases(tr) if tr.exists() else {})]:
        z = cs.get("agent")
        if z:
            rows.append({"path": path, "case": "agent", "rate": z["rate"],
                         "limit": "plain", "limit_rate": cs["plain"]["rate"],
                         "ratio": z["rate"] / cs["plain"]["rate"], "goal": None,
                         "agent_ns": z["agent_ns"], "host_ns": z["host_ns"],
                         "limit_ns": (cs["plain"]["agent_ns"] or 0) + cs["plain"]["host_ns"],
                         "gpus": gpus(z["agent_ns"])})
    fo = fanout(out / "fanout.json", fanout_samples)
    st = stages(out / "breakdown.json")
    tcp = tp.get("agent")
    producer = st[-1][1]
    crc = next(ns for name, ns in st if name == "frame+crc")
    send = tcp["agent_ns"] - producer - crc if tcp and tcp["agent_ns"] else None
    lines = [
        f"- Command: `{command}`; dataset `{dataset}` (Zipf ids, Megatron int32); plan: "
        "seq_len 4095, batch 16, output u16 (2 bytes a token), wire u16 unless said; the "
        "transport row reads real code instead (Rust crate sources, r50k, 16 MB of text: "
        "compression on Zipf ids would say nothing)",
        f"- Machine: {machine(out)}; every limit measured in the same run; medians of the runs",
        f"- GPUs fed per agent core: 10⁹ ÷ (the agent's CPU ns per token) ÷ {GPU_TOKENS_PER_S:,} "
        "tokens/s a GPU (for the local paths, the host's CPU)",
        "",
    ]
    lines += table(rows, "Paths, the agent's default worker pool (none on 2 vCPU)")
    lines += table(rows1, "Paths, one worker thread (the DPU view)")
    lines += table(rows0, "Paths, no worker pool (each session reads on its own thread)")
    if rowsm:
        lines += table(rowsm, "Paths, the agent with --map-budget 0 (every token read by "
                              "pread, then narrowed: the default before maps kept with the "
                              "dataset, and what a dataset past the budget gets)")
    lines += [
        f"### Fan-out ({fo['readers']} subscribers of one shared stream, TCP)", "",
        f"- agent CPU per delivered token: {fo['shared_ns']:.3f} ns, against {fo['lone_ns']:.3f} "
        f"ns for a lone stream ({fo['shared_ns'] / fo['lone_ns']:.2f}×); the slowest "
        f"subscriber's rate ÷ a lone stream's: {fo['rate_ratio']:.2f}×; GPUs fed per agent "
        f"core: {gpus(fo['shared_ns']):,.0f}",
        "",
        "### The producer's stages (one thread, `dquant-offload-bench breakdown`)", "",
        "| stage | CPU ns/token | on a DPU |", "|---|---:|---|",
    ]
    for name, ns in st:
        lines.append(f"| {name} | {ns:.3f} | {DPU.get(name, 'the ARM cores')} |")
    if send is not None:
        lines.append(f"| send (the TCP agent's CPU less the producer and crc: socket writes, "
                     f"the sender thread) | {send:.3f} | {DPU['send']} |")
    lines.append("")
    dpu = dpu_source(out / "dpu.json")
    if dpu:
        lines += dpu_lines(dpu)
    folios = after_shuffled(out)
    if folios:
        lines += folios_lines(folios)
    text = "\n".join(lines)
    return text, (figures(rows, rows1, rows0, rowsm, fo) + dpu_figures(dpu)
                  + folios_figures(folios))


def figures(rows: list[dict], rows1: list[dict], rows0: list[dict], rowsm: list[dict],
            fo: dict) -> list[dict]:
    out = []
    labelled = ([(r, "") for r in rows] + [(r, ", one worker thread") for r in rows1]
                + [(r, ", no worker pool") for r in rows0 if r["case"].startswith("agent-shm")]
                + [(r, ", by pread (--map-budget 0)") for r in rowsm])
    for r, label in labelled:
        lim = f"{r['limit']}: {r['limit_rate'] / 1e6:,.0f} M tokens/s, {r['limit_ns']:.2f} ns/token"
        if r.get("limit_note"):
            lim += f"; {r['limit_note']}"
        out.append({"name": f"{r['path']}{label}: rate ÷ limit", "value": round(r["ratio"], 3),
                    "unit": "×", "baseline": LIMITS[r["limit"]] + f" ({lim})",
                    "goal": None if r["goal"] is None else f">= {r['goal']}"})
        if r["gpus"] is not None:
            who = "agent" if r["agent_ns"] is not None else "host"
            ns = r["agent_ns"] if r["agent_ns"] is not None else r["host_ns"]
            out.append({"name": f"{r['path']}{label}: GPUs fed per {who} core",
                        "value": round(r["gpus"]), "unit": "GPUs",
                        "baseline": f"{ns:.2f} {who} CPU ns/token; {GPU_TOKENS_PER_S:,} tokens/s a GPU",
                        "goal": None})
    out.append({"name": f"fan-out, {fo['readers']} subscribers: agent CPU per delivered token ÷ a lone stream's",
                "value": round(fo["shared_ns"] / fo["lone_ns"], 3), "unit": "×",
                "baseline": f"a lone stream: {fo['lone_ns']:.3f} ns/token", "goal": None})
    return out


def dpu_figures(d: dict | None) -> list[dict]:
    if not d:
        return []
    return [{"name": f"dpu preset source ({d['corpus']}): software LZ4 decode, agent CPU "
                     "ns/token (the stage BlueField-3's decompression engine takes)",
             "value": round(d["hc_ns"], 3), "unit": "ns/token",
             "baseline": f"the same blocks stored plain u16, same run: {d['plain_ns']:.3f} ns/token; "
                         f"{d['hc_bits']:.2f} bits/token stored against 16",
             "goal": None}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dataset", required=True, help="the Megatron prefix the runs read")
    ap.add_argument("--pagecache-into", metavar="NAME",
                    help="only measure the page-cache copy, into OUT/NAME (run.sh: "
                         "pagecache-start.json before the runs, pagecache-after-shuffled.json "
                         "after the cold shuffled pass)")
    ap.add_argument("--command")
    ap.add_argument("--fanout-samples", type=int,
                    help="the samples each fan-out reader streamed (run.sh's share --samples)")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    if a.pagecache_into:
        pc = page_cache_copy(a.dataset)
        (a.out / a.pagecache_into).write_text(json.dumps(pc, indent=1))
        print(f"page-cache copy: {pc['rate'] / 1e6:,.0f} M tokens/s")
        return 0
    if a.command is None or a.fanout_samples is None:
        ap.error("--command and --fanout-samples are required for a report")
    text, figs = report(a.out, a.dataset, a.command, a.fanout_samples)
    (a.out / "report.md").write_text(text)
    print(text)
    if a.record:
        title = ("Cost per token: CPU-ns per token for the agent and the host on each path "
                 "against the limit measured in the same run, and GPUs fed per agent core")
        heading = f"## {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}: cost report\n\n"
        if not benchlib.record("cost", figs, a.command, heading + text + "\n", "--title", title):
            return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except benchlib.BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
