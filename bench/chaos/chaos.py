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

Reported: faults by kind; the flipped chunks and how many reads the corrupt replica refused;
the errors the readers saw, each classed by its cause from the fault log and the reader's
endpoint (`verdict.py`: host-agent fault, reader fault, replica fault, unexplained), with the
first 50 lines of each class (faults.json holds the whole fault log and every error); time
until every reader moved on after each fault (p50, p99, by kind); bytes compared. Then the
verdict, and exit status 1 when it fails: a stream differs, an error that is unexplained or
a replica fault's, more than one resume of a reader for one host-agent fault, a reader that
never finished a pass, no read meeting the corrupt replica's damage, or (under CI=true)
partitions that could not be made; outside CI, the last is a warning. However the run ends
(an error, SIGINT, SIGTERM), every agent and reader it started is stopped. Standard library
only; `bench/chaos/run.sh` builds the binary and calls this.
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
import verdict  # noqa: E402
from benchlib import Agent  # noqa: E402
from verdict import Fault, ReaderError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 2047
BATCH = 8
ITEM = 2  # u16 output
SAMPLE_BYTES = (SEQ_LEN + 1) * ITEM
CHUNK = 1 << 20
log = benchlib.logger("chaos")


class Reader:
    """One `dquant read` through the host agent, restarted from the whole samples it wrote."""

    def __init__(self, idx: int, dquant: str, plan: Path, host: Agent, work: Path, shm: bool):
        self.idx, self.dquant, self.plan, self.host, self.work = idx, dquant, plan, host, work
        self.name = f"{type(self).__name__} {idx}"
        self.endpoint = host.name  # the agent it reads from, for the verdict
        self.started = 0.0         # wall-clock start of the run in hand
        # Through the host's shared-memory ring (its Unix socket), or over TCP.
        self.address = host.socket if shm else f"dquant://{host.control}"
        self.proc: Optional[subprocess.Popen] = None
        self.pass_no = 0
        self.written = 0          # whole-sample bytes of this pass in finished segments
        self.segments: List[Path] = []
        self.errors: List[ReaderError] = []
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
        self.started = time.time()
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

    def kill(self) -> bool:
        """SIGKILL of the reader; whether it was running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self._close_segment()
            self.proc = None
            return True
        return False

    def poll(self, reference: "Reference") -> None:
        """Handles an exit: a finished pass is checked and a new one begun, an error kept
        (for the verdict to class by cause)."""
        if self.proc is None or self.proc.poll() is None:
            return
        rc = self.proc.returncode
        self.proc = None
        self._close_segment()
        if rc == 0:
            self.err.close()
            self._check_pass(reference, whole=True)
            self.pass_no += 1
            self.written, self.segments = 0, []
            return
        self._keep_error(rc)

    def _keep_error(self, rc: int) -> None:
        """The error that ended the run in hand, stamped with when its message was written
        (the stderr file's mtime, which the kernel's coarse clock may put a few ms before the
        run's start: then its start; when it wrote none, now, which can be late when the
        loop was held by a drain), and its stderr file closed."""
        now = time.time()
        self.err.flush()
        self.err.seek(0)
        stderr = self.err.read()
        written = os.fstat(self.err.fileno()).st_mtime
        self.err.close()
        lines = [line for line in stderr.splitlines() if line.strip()]
        at = min(max(written, self.started), now) if lines else now
        last = lines[-1][:300] if lines else f"(no message; exit {rc})"
        self.errors.append(ReaderError(self.name, self.endpoint, self.started, at, rc, last))

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
        self.started = time.time()
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

    def kill(self) -> bool:
        """SIGKILL of the loader and its workers (its own process group); whether it was
        running."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None
            return True
        return False

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
        self.started = time.time()
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

    def kill(self) -> bool:
        """SIGKILL of both members; whether either was running."""
        running = any(p is not None and p.poll() is None for p in self.procs)
        if any(p is not None for p in self.procs):
            self._stop_members()
            self._close_segment()
        return running

    def poll(self, reference: "Reference") -> None:
        codes = [p.poll() if p is not None else None for p in self.procs]
        if self.proc is None or all(c is None for c in codes):
            return
        if codes == [0, 0]:
            self.procs, self.proc = [None, None], None
            self.err.close()
            for m in (0, 1):
                self.segments = self.copies[m]
                self._check_pass(reference, whole=True)
            self.pass_no += 1
            self.written, self.copies = 0, [[], []]
            return
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            self._stop_members()
            self._close_segment()
            self._keep_error(failed)
        # Else one member finished; the other is still reading its last batches.

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
    nets, no_partitions = make_nets(a.netns)
    fault_log: List[Fault] = []
    upstream: Dict[str, List[str]] = {}
    t0 = time.time()
    try:
        faults, recover = soak(a, reference, py_reference, logs, work, agents, readers, nets,
                               fault_log, upstream)
    finally:
        stop_all(agents, readers)
        for n in nets:
            n.close()

    errors = [e for r in readers for e in r.errors]
    verdict.classify_all(errors, fault_log, upstream)
    report = make_report(a, reference, readers, errors, faults, recover, flipped, logs,
                         py_reference is not None, no_partitions)
    judged = verdict.judge(report, errors, fault_log, t0, verdict.in_ci())
    report["verdict"] = {"failures": judged.failures, "warnings": judged.warnings}
    (a.out / "report.json").write_text(json.dumps(report, indent=2))
    (a.out / "faults.json").write_text(json.dumps(verdict.to_json(errors, fault_log, t0),
                                                  indent=1))
    (a.out / "figures.json").write_text(json.dumps({"figures": figures(report)}, indent=2))
    print(render(report))
    print(judged.text())
    (work / "reference").unlink(missing_ok=True)
    (work / "py_reference").unlink(missing_ok=True)
    return 0 if judged.ok else 1


def make_nets(mode: str) -> Tuple[List[netns.Netns], Optional[str]]:
    """The replicas' network namespaces (--netns), and why there are none when partitions
    cannot be made (None: they can, or --netns on, which raises instead)."""
    if mode == "off":
        return [], "--netns off"
    if mode == "auto" and not netns.available():
        why = "not root" if os.geteuid() != 0 else "no `ip` (iproute2)"
        log(f"WARNING {why}: the replicas stay on loopback, and no link is cut")
        return [], why
    nets: List[netns.Netns] = []
    try:
        for k in range(3):
            nets.append(netns.Netns(k))
    except BaseException as e:
        for n in nets:
            n.close()
        if mode == "on" or not isinstance(e, RuntimeError):
            raise
        log(f"WARNING no network namespace ({e}): the replicas stay on loopback, and no link "
            "is cut")
        return [], f"namespace creation failed: {e}"
    return nets, None


ERROR_LINES = 50  # errors of each cause whose lines the report keeps (faults.json has all)


def make_report(a, reference: "Reference", readers: List[Reader], errors: List[ReaderError],
                faults: Dict[str, int], recover: Dict[str, List[float]], flipped: List[str],
                logs: Path, python: bool, no_partitions: Optional[str]) -> dict:
    """What the run did and saw, for report.json, the figures and the verdict."""
    most, _ = verdict.most_resumes(errors)
    return {
        "minutes": a.minutes, "readers": a.readers, "shm_readers": min(a.shm_readers, a.readers),
        "netns": no_partitions is None, "partitions_unavailable": no_partitions,
        "python_readers": a.python_readers if python else 0,
        "share_groups": a.share_groups,
        "seed": a.seed,
        "pass_bytes": reference.size, "faults": faults,
        "reader_errors": verdict.counts(errors), "most_resumes_per_host_fault": most,
        "corrupt_chunks": flipped, "corrupt_reads_refused": refused_reads(logs, "replica2"),
        "passes_checked": sum(r.passes_ok for r in readers),
        "passes_by_reader": {r.name: r.passes_ok for r in readers},
        "bytes_compared": sum(r.bytes_compared for r in readers),
        "recovery_s": {k: {"n": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99)}
                       for k, v in sorted(recover.items())},
        "mismatches": [m for r in readers for m in r.mismatches],
        "error_lines": {c: [f"{e.reader}: {e.line}" for e in errors if e.cause == c][:ERROR_LINES]
                        for c in verdict.CAUSES},
    }


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
         agents: List[Agent], readers: List[Reader], nets: List[netns.Netns],
         fault_log: List[Fault], upstream: Dict[str, List[str]]
         ) -> Tuple[Dict[str, int], Dict[str, List[float]]]:
    """The replicas, the host agent and the readers started (each put in `agents` or `readers`
    first, for `stop_all`), --minutes of faults, and the passes in hand checked. Each fault
    goes to `fault_log` (its time back filled in when its target serves again), and the
    agents behind the host agent to `upstream`. Returns the faults by kind and the recovery
    times by kind."""
    rng = random.Random(a.seed)
    replicas, host = start_cluster(a, logs, work, nets, agents)
    upstream[host.name] = [r.name for r in replicas]
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

    def then_back(fault: Fault, act):
        """`act` (a restart, a heal), then the fault's target stamped back."""
        def run() -> None:
            act()
            fault.back = time.time()
        return run

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
            fault = Fault(kind, "", time.time())
            if kind == "replica_kill":
                victim = rng.choice(killable)
                fault.target = victim.name
                victim.stop(signal.SIGKILL)
                restarts.append((now + rng.uniform(0.2, 2.0), then_back(fault, victim.start)))
            elif kind == "replica_term":
                # A graceful drain: its sessions end with "draining", and the host's reads of
                # it move on; it is restarted once it has exited.
                victim = rng.choice(killable)
                fault.target = victim.name
                victim.proc.send_signal(signal.SIGTERM)
                draining.add(id(victim))
                restarts.append((now + rng.uniform(0.2, 2.0),
                                 then_back(fault, lambda v=victim: restart_drained(v))))
            elif kind == "replica_partition":
                victim = rng.choice(cuttable)
                fault.target = victim.name
                cut[id(victim)].partition()
                restarts.append((now + rng.uniform(*PARTITION_S),
                                 then_back(fault, cut[id(victim)].heal)))
            elif kind in ("host_kill", "host_term"):
                fault.target = host.name
                host.stop(signal.SIGKILL if kind == "host_kill" else signal.SIGTERM, wait=40)
                restarts.append((now + rng.uniform(0.1, 1.0), then_back(fault, host.start)))
            else:
                victim = rng.choice(readers)
                fault.target = victim.name
                if victim.kill():
                    fault.back = time.time()
                else:
                    fault = None  # it had ended already: nothing was killed
            if fault is not None:
                fault_log.append(fault)
            faults[kind] = faults.get(kind, 0) + 1
            pending.append((kind, now, before))
            next_fault = time.monotonic() + rng.uniform(0.3, 1.5)
        time.sleep(0.02)

    for f in fault_log:
        if f.kind == "replica_partition" and f.back is None:
            cut[id(next(r for r in replicas if r.name == f.target))].heal()
            f.back = time.time()
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
    replica = sum(f.get(k, 0) for k in ("replica_kill", "replica_term", "replica_partition"))
    idle = [k for k, n in r["passes_by_reader"].items() if n == 0]
    out = [
        {"name": "reader-visible errors caused by replica faults",
         "value": e[verdict.REPLICA_FAULT],
         "unit": "errors", "goal": "<= 0",
         "baseline": f"{replica} replica faults in the same run ({f.get('replica_kill', 0)} "
                     "SIGKILLs), another replica serving at each"},
        {"name": "streams that differ from the local read", "value": len(r["mismatches"]),
         "unit": "streams", "goal": "<= 0",
         "baseline": f"{r['passes_checked']} whole passes checked, "
                     f"{r['bytes_compared'] / 1e9:.2f} GB compared"},
        {"name": "reads the corrupt replica refused (never served, never a reader's error)",
         "value": r["corrupt_reads_refused"], "unit": "reads", "goal": ">= 1",
         "baseline": f"{len(r['corrupt_chunks'])} chunks with a flipped bit in one replica's "
                     "copy, checked by the streams above"},
        {"name": "resumes per reader per host-agent fault",
         "value": round(e[verdict.HOST_FAULT] / max(1, host * readers), 3),
         "unit": "resumes", "goal": "<= 1",
         "baseline": f"{host} host-agent faults (SIGKILL and SIGTERM), {readers} readers"},
        {"name": "most resumes of one reader for one host-agent fault",
         "value": r["most_resumes_per_host_fault"], "unit": "resumes", "goal": "<= 1",
         "baseline": f"{e[verdict.HOST_FAULT]} reader errors laid to {host} host-agent faults"},
        {"name": "reader errors no injected fault explains", "value": e[verdict.UNEXPLAINED],
         "unit": "errors", "goal": "<= 0",
         "baseline": f"{sum(e.values())} reader errors, each classed by the fault log"},
        {"name": "reader errors caused by host-agent faults", "value": e[verdict.HOST_FAULT],
         "unit": "errors", "goal": None,
         "baseline": f"{host} host-agent SIGKILLs and SIGTERMs, {readers} readers"},
        {"name": "reader errors caused by the reader's own SIGKILL",
         "value": e[verdict.READER_FAULT], "unit": "errors", "goal": None,
         "baseline": f"{f.get('reader_kill', 0)} reader SIGKILLs"},
        {"name": "readers that never finished a pass", "value": len(idle), "unit": "readers",
         "goal": "<= 0", "baseline": f"{len(r['passes_by_reader'])} readers"
                                     + (f" ({', '.join(idle)} idle)" if idle else "")},
        {"name": "replica links cut (partitions)", "value": f.get("replica_partition", 0),
         "unit": "faults", "goal": ">= 1",
         "baseline": (f"{replica} replica faults in all" if r["netns"]
                      else f"partitions unavailable: {r['partitions_unavailable']}")},
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
    lines += ["", "| errors readers saw, by cause (from the fault log) | count |", "|---|---|"]
    for k in verdict.CAUSES:
        lines.append(f"| {k} | {r['reader_errors'][k]} |")
    lines += ["", f"Most resumes of one reader for one host-agent fault: "
              f"{r['most_resumes_per_host_fault']}."]
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
