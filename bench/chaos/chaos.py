#!/usr/bin/env python3
"""The chaos soak (issue 35): faults without loss, checked sample for sample.

Three storage agents serve the same corpus (replicas), a host agent chains to them, and
readers stream a blended plan whose sources name the three replicas through the host agent:
`dquant read`s (--shm-readers of them, one by default, through its shared-memory ring, the rest
over TCP), --share-groups pairs reading one shared stream (`dquant read --share --group 2`
over TCP and `dquant subscribe` over shared memory, failing and resuming together, as a
tensor-parallel group does), and with --python, --python-readers `dquant.torch.TokenDataset`s
under a DataLoader with two workers (`pyreader.py`, over shared memory, checkpointing after
every batch; for an agent's plan the workers are two sessions of the agent's, read in the
reader's process). For --minutes, one fault every 0.3-1.5 s, drawn from:

- replica_kill: SIGKILL of a replica while a clean one (not the corrupt copy below) serves on,
  back 0.2-2 s later at its address;
- host_kill / host_term: SIGKILL or SIGTERM (a graceful drain) of the host agent, which comes
  back 0.1-1 s later at its address;
- replica_term: SIGTERM of a replica (a graceful drain) under the same rule, restarted once it
  has exited;
- replica_partition: the link of a replica's network namespace cut for 1-4 s (packets vanish
  either way, no reset), while another clean replica serves; with --netns (the default when
  root and iproute2 are here) every replica runs in a namespace of its own, reached over a
  veth pair, and serves the host agent as a tenant on that private link;
- reader_kill: SIGKILL of a reader (a pair: both; a TokenDataset: its workers too).

The third replica's copy of each corpus also has --corrupt bits flipped on its disk, one per
chunk of the `.bin` (the corpora carry chunk sums sidecars, `dquant sums`): its agent must fail
every read that meets one, and the reads move to the other replicas, so no reader ever sees
a damaged token or an error for it.

Each reader restarts from the whole samples it wrote (`--cursor`), its bytes appended to what
it had. A reader whose plan ends starts another pass. The checker: every finished pass is
byte-identical to the plan read locally in one go (the same samples, each exactly once, in
order), and the pass cut short at the end is a prefix of it.

Reported: faults by kind; the flipped chunks and how many reads the corrupt replica refused; errors the readers saw, by cause (a replica fault while another
replica served must never be one), with the last line of each: every one that is not a
host-agent connection failure, and the first 50 of those; time until every reader moved on
after each fault (p50, p99, by kind); bytes compared. Exit status 1 when a stream differs, a
replica fault reached a reader, or no read met the corrupt replica's damage. However the run
ends (an error, SIGINT, SIGTERM), every agent and reader it started is stopped. Standard library only; `bench/chaos/run.sh` builds the
binary and calls this.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # noqa: E402
import netns  # noqa: E402
from benchlib import Agent  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 2047
BATCH = 8
ITEM = 2  # u16 output
SAMPLE_BYTES = (SEQ_LEN + 1) * ITEM
CHUNK = 1 << 20
HOST_LINES = 50  # host-agent connection failures whose lines the report keeps (all counted)
log = benchlib.logger("chaos")


def classify(stderr: str) -> str:
    """What a reader's error came from, by its message."""
    if "every replica" in stderr or "no replica of" in stderr:
        return "replicas"
    host = ("shutting down", "draining", "connection refused", "Connection refused",
            "reset", "closed", "broken pipe", "Broken pipe", "unavailable", "transport error",
            "without an end frame", "timed out",
            # the shared-memory ring's consumer, when the agent behind it dies
            "agent went away",
            # a reader started just before the host agent died: its socket is gone
            "cannot reach agent",
            # the host agent restarted between the reader's Open and its data connection:
            # the new agent never opened that session
            "or wrong ticket")
    if any(h in stderr for h in host):
        return "host agent"
    return "other"


class Reader:
    """One `dquant read` through the host agent, restarted from the whole samples it wrote."""

    def __init__(self, idx: int, dquant: str, plan: Path, host: Agent, work: Path, shm: bool):
        self.idx, self.dquant, self.plan, self.host, self.work = idx, dquant, plan, host, work
        # Through the host's shared-memory ring (its Unix socket), or over TCP.
        self.address = host.socket if shm else f"dquant://{host.control}"
        self.proc: Optional[subprocess.Popen] = None
        self.pass_no = 0
        self.written = 0          # whole-sample bytes of this pass in finished segments
        self.segments: List[Path] = []
        self.errors: Dict[str, int] = {}
        self.error_lines: List[Tuple[str, str]] = []  # (cause, the error's last line)
        self.passes_ok = 0
        self.bytes_compared = 0
        self.mismatches: List[str] = []

    def out(self) -> Path:
        return self.work / f"r{self.idx}.p{self.pass_no}.s{len(self.segments)}"

    def start(self) -> None:
        seg = self.out()
        self.segments.append(seg)
        cursor = self.written // SAMPLE_BYTES
        self.err = open(self.work / f"r{self.idx}.err", "w+")
        self.proc = subprocess.Popen(
            [self.dquant, "read", str(self.plan), "--agent", self.address,
             "--out", str(seg), "--cursor", str(cursor), "--quiet"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err)

    def progress(self) -> int:
        """Bytes of the stream written so far (passes before this one count whole)."""
        live = self.segments[-1].stat().st_size if self.segments and self.segments[-1].exists() else 0
        return self.pass_no * 10**15 + self.written + live

    def _close_segment(self) -> None:
        """Keeps the whole samples of the last segment."""
        seg = self.segments[-1]
        size = seg.stat().st_size if seg.exists() else 0
        whole = size - size % SAMPLE_BYTES
        if whole != size:
            with open(seg, "r+b") as f:
                f.truncate(whole)
        self.written += whole

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self._close_segment()
            self.proc = None

    def poll(self, reference: "Reference") -> Optional[str]:
        """Handles an exit: a finished pass is checked and a new one begun, an error counted
        by cause. Returns the cause of an error, if one ended the reader."""
        if self.proc is None or self.proc.poll() is None:
            return None
        rc = self.proc.returncode
        self.proc = None
        self._close_segment()
        self.err.seek(0)
        stderr = self.err.read()
        self.err.close()
        if rc == 0:
            self._check_pass(reference, whole=True)
            self.pass_no += 1
            self.written, self.segments = 0, []
            return None
        cause = classify(stderr)
        self.errors[cause] = self.errors.get(cause, 0) + 1
        last = [l for l in stderr.splitlines() if l.strip()][-1:] or ["(no message)"]
        self.error_lines.append((cause, f"{cause}: {last[0][:300]}"))
        return cause

    def _check_pass(self, reference: "Reference", whole: bool) -> None:
        h = hashlib.blake2b(digest_size=16)
        n = 0
        # A read resumed at the end of the plan writes nothing, and may make no file.
        for seg in (s for s in self.segments if s.exists()):
            with open(seg, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
                    n += len(chunk)
        ok = reference.matches(h, n, whole)
        self.bytes_compared += n
        if ok:
            self.passes_ok += whole
        else:
            self.mismatches.append(f"reader {self.idx} pass {self.pass_no}: {n} bytes differ "
                                   f"from the local stream ({'whole' if whole else 'prefix'})")
        for seg in self.segments:
            seg.unlink(missing_ok=True)

    def finish(self, reference: "Reference") -> None:
        """At the end: the pass in hand, cut short, must be a prefix of the stream."""
        self.kill()
        if self.segments:
            self._check_pass(reference, whole=False)


class PyReader(Reader):
    """A `dquant.torch.TokenDataset` under a DataLoader with workers (`pyreader.py`), through
    the host agent's shared-memory rings (a session per worker): it checkpoints after every
    batch and resumes from its checkpoint, as a training job does. Its stream is the loader's
    (workers' batches interleaved), so it is checked against `pyreader.py` run locally (ring
    workers), its own reference."""

    def __init__(self, idx: int, python: str, plan: Path, host: Agent, work: Path,
                 reference: "Reference"):
        super().__init__(idx, "", plan, host, work, shm=True)
        self.python, self.reference = python, reference

    def out(self) -> Path:
        return self.work / f"py{self.idx}.p{self.pass_no}"

    def state(self) -> Path:
        return self.work / f"py{self.idx}.p{self.pass_no}.state"

    def start(self) -> None:
        self.segments = [self.out()]
        self.err = open(self.work / f"py{self.idx}.err", "w+")
        self.proc = subprocess.Popen(
            [self.python, str(Path(__file__).parent / "pyreader.py"), "--plan", str(self.plan),
             "--agent", self.address, "--out", str(self.out()), "--state", str(self.state())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err,
            start_new_session=True)

    def progress(self) -> int:
        out = self.out()
        return self.pass_no * 10**15 + (out.stat().st_size if out.exists() else 0)

    def _close_segment(self) -> None:
        """Nothing: the next start cuts the file back to its checkpoint."""

    def kill(self) -> None:
        """SIGKILL of the loader and its workers (its own process group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def _check_pass(self, reference: "Reference", whole: bool) -> None:
        super()._check_pass(self.reference, whole)
        self.state().unlink(missing_ok=True)

    def finish(self, reference: "Reference") -> None:
        """At the end: the pass in hand, cut back to its checkpoint, must be a prefix."""
        self.kill()
        out, state = self.out(), self.state()
        if out.exists():
            kept = json.loads(state.read_text())["bytes"] if state.exists() else 0
            with open(out, "r+b") as f:
                f.truncate(kept)
            self._check_pass(self.reference, whole=False)


class ShareGroup(Reader):
    """A tensor-parallel pair reading one shared stream through the host agent: `dquant read
    --share NAME --group 2` opens it, `dquant subscribe` joins it over shared memory. Each
    writes its own copy, and each copy is checked against the plan read locally. Like a
    training job's TP group, the pair fails and resumes together: when either member stops,
    the other is stopped, both copies are cut back to the samples both hold, and both start
    again there on a stream of a new name (the old one may still be ending)."""

    def __init__(self, idx: int, dquant: str, plan: Path, host: Agent, work: Path):
        super().__init__(idx, dquant, plan, host, work, shm=False)
        self.socket = host.socket
        self.gen = 0
        self.copies: List[List[Path]] = [[], []]   # each member's segments of this pass
        self.procs: List[Optional[subprocess.Popen]] = [None, None]

    def start(self) -> None:
        self.gen += 1
        name = f"soak/g{self.idx}/{self.gen}"
        cursor = self.written // SAMPLE_BYTES
        segs = [self.work / f"g{self.idx}.p{self.pass_no}.m{m}.s{len(self.copies[m])}"
                for m in (0, 1)]
        for m in (0, 1):
            self.copies[m].append(segs[m])
        self.err = open(self.work / f"g{self.idx}.err", "w+")
        opener = [self.dquant, "read", str(self.plan), "--agent", self.address, "--share", name,
                  "--group", "2", "--cursor", str(cursor), "--out", str(segs[0]), "--quiet"]
        joiner = [self.dquant, "subscribe", self.socket, name, "--cursor-json",
                  json.dumps({"consumed_samples": cursor}), "--wait", "30", "--out",
                  str(segs[1]), "--quiet"]
        self.procs = [subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=self.err) for c in (opener, joiner)]
        self.proc = self.procs[0]

    def progress(self) -> int:
        """The slower member's bytes: the pair moved on when both did."""
        def size(segs: List[Path]) -> int:
            return sum(p.stat().st_size for p in segs if p.exists())
        return self.pass_no * 10**15 + min(size(c) for c in self.copies)

    def _stop_members(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait()
        self.procs = [None, None]
        self.proc = None

    def _close_segment(self) -> None:
        """Both copies cut back to the whole samples both hold (from their last segments)."""
        def total(segs: List[Path]) -> int:
            return sum(p.stat().st_size for p in segs if p.exists())
        keep = min(total(c) for c in self.copies)
        keep -= keep % SAMPLE_BYTES
        for segs in self.copies:
            extra = total(segs) - keep
            for seg in reversed(segs):
                size = seg.stat().st_size if seg.exists() else 0
                cut = min(extra, size)
                if cut:
                    with open(seg, "r+b") as f:
                        f.truncate(size - cut)
                    extra -= cut
        self.written = keep

    def kill(self) -> None:
        if any(p is not None for p in self.procs):
            self._stop_members()
            self._close_segment()

    def poll(self, reference: "Reference") -> Optional[str]:
        codes = [p.poll() if p is not None else None for p in self.procs]
        if self.proc is None or all(c is None for c in codes):
            return None
        if codes == [0, 0]:
            self.procs, self.proc = [None, None], None
            self.err.close()
            for m in (0, 1):
                self.segments = self.copies[m]
                self._check_pass(reference, whole=True)
            self.pass_no += 1
            self.written, self.copies = 0, [[], []]
            return None
        if any(c not in (None, 0) for c in codes):
            self._stop_members()
            self._close_segment()
            self.err.seek(0)
            stderr = self.err.read()
            self.err.close()
            cause = classify(stderr)
            self.errors[cause] = self.errors.get(cause, 0) + 1
            last = [l for l in stderr.splitlines() if l.strip()][-1:] or ["(no message)"]
            self.error_lines.append((cause, f"{cause}: {last[0][:300]}"))
            return cause
        return None  # one member finished; the other is still reading its last batches

    def finish(self, reference: "Reference") -> None:
        self.kill()
        for m in (0, 1):
            if self.copies[m]:
                self.segments = self.copies[m]
                self._check_pass(reference, whole=False)


class Reference:
    """The plan's stream read locally in one go: its length, hash, and the file for
    prefix checks."""

    def __init__(self, path: Path):
        self.path = path
        self.size = path.stat().st_size
        h = hashlib.blake2b(digest_size=16)
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        self.digest = h.digest()

    def matches(self, h, n: int, whole: bool) -> bool:
        if whole:
            return n == self.size and h.digest() == self.digest
        if n > self.size:
            return False
        ref = hashlib.blake2b(digest_size=16)
        with open(self.path, "rb") as f:
            left = n
            while left:
                chunk = f.read(min(CHUNK, left))
                ref.update(chunk)
                left -= len(chunk)
        return ref.digest() == h.digest()


DATASETS = ("web", "code")
SUMS_CHUNK = 64 << 10  # dquant sums' default chunk


def make_data(dquant: str, data: Path, tokens: int) -> None:
    """The two corpora, each with its chunk sums sidecar, made once."""
    data.mkdir(parents=True, exist_ok=True)
    for name, seed, n in zip(DATASETS, (1, 2), (tokens, tokens // 2)):
        if not (data / f"{name}.idx").exists():
            subprocess.run([dquant, "corpus", "zipf", str(data / name), "--tokens", str(n),
                            "--seed", str(seed), "--eod", "50256", "--quiet"], check=True,
                           stdout=subprocess.DEVNULL)
        if not (data / f"{name}.dqsum").exists():
            subprocess.run([dquant, "sums", str(data / name), "--quiet"], check=True,
                           stdout=subprocess.DEVNULL)


def corrupt_copy(data: Path, dst: Path, flips: int, rng: random.Random) -> List[str]:
    """A copy of the corpora in `dst` with one bit flipped in each of `flips` distinct chunks
    of every `.bin` (the `.idx` and sidecar linked, unchanged). Returns `NAME.bin: chunk N`
    for each."""
    dst.mkdir(parents=True, exist_ok=True)
    flipped = []
    for name in DATASETS:
        for ext in (".idx", ".dqsum"):
            target = dst / f"{name}{ext}"
            target.unlink(missing_ok=True)
            target.hardlink_to(data / f"{name}{ext}")
        raw = bytearray((data / f"{name}.bin").read_bytes())
        chunks = rng.sample(range(len(raw) // SUMS_CHUNK), flips)
        for c in sorted(chunks):
            at = c * SUMS_CHUNK + rng.randrange(SUMS_CHUNK)
            raw[at] ^= 1 << rng.randrange(8)
            flipped.append(f"{name}.bin: chunk {c}")
        (dst / f"{name}.bin").write_bytes(raw)
    return flipped


def refused_reads(logs: Path, name: str) -> int:
    """Reads the agent `name` refused for a chunk that failed its sums, from its logs."""
    return sum(p.read_text(errors="replace").count("checksum mismatch in chunk")
               for p in logs.glob(f"{name}.*.log"))


def write_plan(path: Path, uris: List[str], samples: int) -> None:
    plan = {
        "seq_len": SEQ_LEN, "batch_size": BATCH, "seed": 7, "shuffle": True,
        "samples": samples, "output": "u16", "wire_codec": "u16",
        "sources": [{"uri": uris[0], "weight": 0.7}, {"uri": uris[1], "weight": 0.3}],
    }
    path.write_text(json.dumps(plan))


def percentile(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="example: bench/chaos/run.sh --minutes 2")
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--shm-readers", type=int, default=1,
                    help="how many of the readers read through the host agent's shared-memory "
                         "ring (its Unix socket); the rest over TCP")
    ap.add_argument("--samples", type=int, default=40_000,
                    help="samples per pass (4 MiB of u16 per 1000)")
    ap.add_argument("--tokens", type=int, default=16_000_000, help="tokens of the larger dataset")
    ap.add_argument("--seed", type=int, default=0, help="the fault schedule's seed")
    ap.add_argument("--corrupt", type=int, default=4,
                    help="chunks of each .bin with a flipped bit in the third replica's copy "
                         "(0: none)")
    ap.add_argument("--netns", choices=("auto", "on", "off"), default="auto",
                    help="the replicas each in a network namespace of its own, so that their "
                         "links can be cut (replica_partition faults); auto: when root and "
                         "iproute2 are here")
    ap.add_argument("--share-groups", type=int, default=1,
                    help="pairs reading one shared stream (an opener over TCP, a subscriber over "
                         "shared memory), failing and resuming together")
    ap.add_argument("--python", help="a Python with dquant and torch (python/test.sh "
                    "--no-tests prints one); with it, --python-readers more readers")
    ap.add_argument("--python-readers", type=int, default=1,
                    help="TokenDataset readers (a DataLoader with 2 workers, over shared memory, "
                         "checkpointing after every batch), with --python")
    ap.add_argument("--dquant", default=str(REPO / "target" / "release" / "dquant"))
    ap.add_argument("--data", type=Path, default=Path("/var/tmp/dquant-chaos"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    benchlib.exit_on(signal.SIGINT, signal.SIGTERM)
    a.out.mkdir(parents=True, exist_ok=True)
    logs, work = a.out / "logs", a.out / "work"
    logs.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    make_data(a.dquant, a.data, a.tokens)

    local_plan = work / "local.json"
    write_plan(local_plan, [str(a.data / "web"), str(a.data / "code")], a.samples)
    log("the reference: the plan read locally")
    subprocess.run([a.dquant, "read", str(local_plan), "--out", str(work / "reference"),
                    "--quiet"], check=True, stderr=subprocess.DEVNULL)
    reference = Reference(work / "reference")
    py_reference = None
    if a.python and a.python_readers:
        log("the Python readers' reference: pyreader.py run locally")
        subprocess.run([a.python, str(Path(__file__).parent / "pyreader.py"), "--plan",
                        str(local_plan), "--out", str(work / "py_reference"), "--state",
                        str(work / "py_reference.state")], check=True)
        py_reference = Reference(work / "py_reference")

    agents: List[Agent] = []
    readers: List[Reader] = []
    flipped = corrupt_copy(a.data, work / "corrupt", a.corrupt, random.Random(a.seed)) \
        if a.corrupt else []
    nets: List[netns.Netns] = []
    if a.netns == "on" or (a.netns == "auto" and netns.available()):
        try:
            for k in range(3):
                nets.append(netns.Netns(k))
        except BaseException:
            for n in nets:
                n.close()
            raise
    elif a.netns == "auto":
        log("not root or no `ip`: the replicas stay on loopback, and no link is cut")
    try:
        faults, recover = soak(a, reference, py_reference, logs, work, agents, readers, nets)
    finally:
        stop_all(agents, readers)
        for n in nets:
            n.close()

    errors: Dict[str, int] = {}
    for r in readers:
        for k, v in r.errors.items():
            errors[k] = errors.get(k, 0) + v
    mismatches = [m for r in readers for m in r.mismatches]
    lines = [x for r in readers for x in r.error_lines]
    host_lines = [line for cause, line in lines if cause == "host agent"]
    report = {
        "minutes": a.minutes, "readers": a.readers, "shm_readers": min(a.shm_readers, a.readers),
        "netns": bool(nets),
        "python_readers": a.python_readers if py_reference else 0,
        "share_groups": a.share_groups,
        "seed": a.seed,
        "pass_bytes": reference.size, "faults": faults, "reader_errors": errors,
        "corrupt_chunks": flipped, "corrupt_reads_refused": refused_reads(logs, "replica2"),
        "passes_checked": sum(r.passes_ok for r in readers),
        "passes_by_reader": {f"{type(r).__name__} {r.idx}": r.passes_ok for r in readers},
        "bytes_compared": sum(r.bytes_compared for r in readers),
        "recovery_s": {k: {"n": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99)}
                       for k, v in sorted(recover.items())},
        "mismatches": mismatches,
        # Every error that is not a host-agent connection failure, then the first of those.
        "error_lines": [line for cause, line in lines if cause != "host agent"]
                       + host_lines[:HOST_LINES],
        "host_agent_error_lines_left_out": max(0, len(host_lines) - HOST_LINES),
    }
    (a.out / "report.json").write_text(json.dumps(report, indent=2))
    (a.out / "figures.json").write_text(json.dumps({"figures": figures(report)}, indent=2))
    print(render(report))
    (work / "reference").unlink(missing_ok=True)
    (work / "py_reference").unlink(missing_ok=True)
    if report["passes_checked"] == 0:
        log("no pass finished: nothing was checked whole (more --minutes, or fewer --samples)")
        return 1
    idle = [k for k, v in report["passes_by_reader"].items() if v == 0]
    if idle and a.minutes >= 2:
        log(f"no whole pass from {', '.join(idle)}: their kind was not checked whole")
    # Flipped chunks that no read met would prove nothing.
    unmet = bool(report["corrupt_chunks"]) and report["corrupt_reads_refused"] == 0
    if unmet:
        log("the corrupt replica refused no read: its damage was never met")
    bad = bool(mismatches) or errors.get("replicas", 0) > 0 or unmet
    return 1 if bad else 0


TOKEN = "chaos-soak-host-token-0123456789"  # the host agent's, on the replicas' links
PARTITION_S = (1.0, 4.0)  # how long a partition lasts


def replica_config(work: Path, data: Path, i: int) -> Path:
    """Replica i's config: the corpus, and (for an address beyond loopback) the host's tenant
    token and plaintext on its private link."""
    conf = work / f"replica{i}.toml"
    conf.write_text("\n".join([
        "allow_plaintext = true", "worker_threads = 0",
        "[[tenants]]", 'name = "host"', f'token = "{TOKEN}"', 'roots = ["*"]',
        "[roots]", f'corpus = "{data}"', ""]))
    return conf


def start_cluster(a, logs: Path, work: Path, nets: List[netns.Netns],
                  agents: List[Agent]) -> Tuple[List[Agent], Agent]:
    """The three replicas (each in a namespace of its own when `nets` has them, the third on
    the corrupt copy when there is one) and the host agent chained to them, started."""
    replicas = []
    for i in range(3):
        data = work / "corrupt" if a.corrupt and i == 2 else a.data
        where = dict(host=nets[i].addr, prefix=nets[i].prefix()) if nets else {}
        replicas.append(Agent(a.dquant, ["--config", str(replica_config(work, data, i))],
                              name=f"replica{i}", fixed=True, logs=logs, **where))
    agents += replicas
    for r in replicas:
        r.start()
    host_conf = work / "host.toml"
    host_conf.write_text(f'upstream_token = "{TOKEN}"\n')
    ups = [x for r in replicas for x in ("--upstream", r.control)]
    host = Agent(a.dquant, ["--config", str(host_conf), "--root", f"none={work}",
                            "--prefetch-frames", "2", *ups],
                 name="host", fixed=True, socket=True, logs=logs)
    agents.append(host)
    host.start()
    return replicas, host


def soak(a, reference: Reference, py_reference: Optional[Reference], logs: Path, work: Path,
         agents: List[Agent], readers: List[Reader], nets: List[netns.Netns]
         ) -> Tuple[Dict[str, int], Dict[str, List[float]]]:
    """The replicas, the host agent and the readers started (each put in `agents` or `readers`
    first, for `stop_all`), --minutes of faults, and the passes in hand checked. Returns the
    faults by kind and the recovery times by kind."""
    rng = random.Random(a.seed)
    replicas, host = start_cluster(a, logs, work, nets, agents)
    authorities = ",".join(r.control for r in replicas)
    plan = work / "plan.json"
    write_plan(plan, [f"dquant://{authorities}/corpus/web", f"dquant://{authorities}/corpus/code"],
               a.samples)
    readers += [Reader(i, a.dquant, plan, host, work, shm=i < a.shm_readers)
                for i in range(a.readers)]
    readers += [ShareGroup(len(readers) + i, a.dquant, plan, host, work)
                for i in range(a.share_groups)]
    if py_reference is not None:
        readers += [PyReader(len(readers) + i, a.python, plan, host, work, py_reference)
                    for i in range(a.python_readers)]
    for r in readers:
        r.start()

    # A replica serves when it is up and its link is not cut; the corrupt one (when there is
    # one) cannot serve its damaged chunks, so a replica fault needs a clean one serving on.
    clean = replicas[:2] if a.corrupt else replicas
    cut = {id(r): n for r, n in zip(replicas, nets)}

    draining: set = set()

    def serving(r: Agent) -> bool:
        cut_off = id(r) in cut and cut[id(r)].partitioned
        return r.up() and not cut_off and id(r) not in draining

    def restart_drained(r: Agent) -> None:
        r.stop(signal.SIGTERM, wait=40)
        draining.discard(id(r))
        r.start()

    def may_fault(victim: Agent) -> bool:
        return any(serving(c) for c in clean if c is not victim)

    faults: Dict[str, int] = {}
    recover: Dict[str, List[float]] = {}
    pending: List[tuple] = []            # (kind, at, progress of each reader then)
    restarts: List[tuple] = []           # (when, what to call)
    end = time.monotonic() + a.minutes * 60
    next_fault = time.monotonic() + rng.uniform(0.3, 1.5)
    log(f"{a.minutes} min of faults: 3 replicas{' in network namespaces' if nets else ''}, "
        f"a host agent, {len(readers)} readers; {reference.size / 1e6:.0f} MB per pass")
    while time.monotonic() < end:
        now = time.monotonic()
        for when, act in [x for x in restarts if x[0] <= now]:
            restarts.remove((when, act))
            act()
        for r in readers:
            r.poll(reference)
            if r.proc is None and host.up():
                r.start()
        for p in list(pending):
            kind, at, before = p
            if all(r.progress() > b for r, b in zip(readers, before)):
                recover.setdefault(kind, []).append(now - at)
                pending.remove(p)
        if now >= next_fault:
            killable = [r for r in replicas if serving(r) and may_fault(r)]
            cuttable = [r for r in killable if nets and not any(n.partitioned for n in nets)]
            kinds = ["reader_kill"]
            if host.up():
                kinds += ["host_kill", "host_term"]
            kinds += ["replica_kill"] * (2 if killable else 0)
            kinds += ["replica_term"] * (1 if killable else 0)
            kinds += ["replica_partition"] * (2 if cuttable else 0)
            kind = rng.choice(kinds)
            before = [r.progress() for r in readers]
            if kind == "replica_kill":
                victim = rng.choice(killable)
                victim.stop(signal.SIGKILL)
                restarts.append((now + rng.uniform(0.2, 2.0), victim.start))
            elif kind == "replica_term":
                # A graceful drain: its sessions end with "draining", and the host's reads of
                # it move on; it is restarted once it has exited.
                victim = rng.choice(killable)
                victim.proc.send_signal(signal.SIGTERM)
                draining.add(id(victim))
                restarts.append((now + rng.uniform(0.2, 2.0),
                                 lambda v=victim: restart_drained(v)))
            elif kind == "replica_partition":
                link = cut[id(rng.choice(cuttable))]
                link.partition()
                restarts.append((now + rng.uniform(*PARTITION_S), link.heal))
            elif kind in ("host_kill", "host_term"):
                host.stop(signal.SIGKILL if kind == "host_kill" else signal.SIGTERM, wait=40)
                restarts.append((now + rng.uniform(0.1, 1.0), host.start))
            else:
                victim = rng.choice(readers)
                victim.kill()
            faults[kind] = faults.get(kind, 0) + 1
            pending.append((kind, now, before))
            next_fault = time.monotonic() + rng.uniform(0.3, 1.5)
        time.sleep(0.02)

    for n in nets:
        if n.partitioned:
            n.heal()
    log("faults over: checking the passes in hand")
    for r in readers:
        r.poll(reference)
        r.finish(reference)
    return faults, recover


def stop_all(agents: List[Agent], readers: List[Reader]) -> None:
    """Every reader and agent the run started, stopped (SIGKILL), however the run ends; a
    second ^C or SIGTERM is ignored meanwhile, so that nothing is left behind."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    for p in [r.proc for r in readers if r.proc is not None]:
        if p.poll() is None:
            p.kill()
        p.wait()
    for agent in agents:
        agent.close(signal.SIGKILL)


def figures(r: dict) -> List[dict]:
    """The soak's figures in bench/results.py's schema: each against what the same run did."""
    f, e, rec = r["faults"], r["reader_errors"], r["recovery_s"]
    host = f.get("host_kill", 0) + f.get("host_term", 0)
    readers = r["readers"] + r.get("python_readers", 0) + r.get("share_groups", 0)
    out = [
        {"name": "reader-visible errors caused by replica faults", "value": e.get("replicas", 0),
         "unit": "errors", "goal": "<= 0",
         "baseline": f"{f.get('replica_kill', 0)} replica SIGKILLs in the same run, another "
                     "replica serving at each"},
        {"name": "streams that differ from the local read", "value": len(r["mismatches"]),
         "unit": "streams", "goal": "<= 0",
         "baseline": f"{r['passes_checked']} whole passes checked, "
                     f"{r['bytes_compared'] / 1e9:.2f} GB compared"},
        {"name": "reads the corrupt replica refused (never served, never a reader's error)",
         "value": r["corrupt_reads_refused"], "unit": "reads", "goal": ">= 1",
         "baseline": f"{len(r['corrupt_chunks'])} chunks with a flipped bit in one replica's "
                     "copy, checked by the streams above"},
        {"name": "resumes per reader per host-agent fault",
         "value": round(e.get("host agent", 0) / max(1, host * readers), 3),
         "unit": "resumes", "goal": "<= 1",
         "baseline": f"{host} host-agent faults (SIGKILL and SIGTERM), {readers} readers"},
    ]
    for kind, label in (("replica_kill", "a replica SIGKILL"), ("host_kill", "a host-agent SIGKILL")):
        if kind in rec:
            out.append({"name": f"every reader moving on after {label}, p99",
                        "value": round(rec[kind]["p99"], 3), "unit": "s", "goal": None,
                        "baseline": f"p50 {rec[kind]['p50']:.3f} s over {rec[kind]['n']} faults"})
    return out


def render(r: dict) -> str:
    lines = [f"# Chaos soak: {r['minutes']} min, {r['readers']} readers "
             f"({r.get('shm_readers', 0)} over shared memory), {r.get('share_groups', 0)} "
             f"shared-stream pair(s) and {r.get('python_readers', 0)} Python TokenDataset "
             f"reader(s), seed {r['seed']}", "",
             "| fault | count | readers moved on after: p50 | p99 |", "|---|---|---|---|"]
    for k, n in sorted(r["faults"].items()):
        rec = r["recovery_s"].get(k, {})
        lines.append(f"| {k} | {n} | {rec.get('p50', float('nan')):.2f} s | "
                     f"{rec.get('p99', float('nan')):.2f} s |")
    lines += ["", "| errors readers saw, by cause | count |", "|---|---|"]
    for k in ("replicas", "host agent", "other"):
        lines.append(f"| {k} | {r['reader_errors'].get(k, 0)} |")
    lines += ["", f"Corrupt replica: {len(r['corrupt_chunks'])} chunks with a flipped bit, "
              f"{r['corrupt_reads_refused']} reads refused for them."]
    by = ", ".join(f"{k}: {v}" for k, v in r.get("passes_by_reader", {}).items())
    lines += ["", f"Passes checked whole: {r['passes_checked']} ({by}); bytes compared: "
              f"{r['bytes_compared'] / 1e9:.2f} GB; streams that differ: {len(r['mismatches'])}."]
    for m in r["mismatches"]:
        lines.append(f"- {m}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
