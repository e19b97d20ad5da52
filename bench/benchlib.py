"""Plumbing shared by the benchmark scripts: the `dquant serve` child process, /proc figures,
the spread and median of runs, logging, the commit, and recording through bench/results.py.

Why: python/bench.py, megatron/bench.py, mount/bench.py and chaos/chaos.py each had a copy of
these (four agent classes, three readers of /proc), and the copies drifted: two agents were
killed when they hung on exit, two were left running. Scripts import it with
`sys.path.insert(0, str(Path(__file__).resolve().parents[1]))` then `import benchlib`.
Standard library only: chaos.py runs with the system python3. (bench/results.py does not use
it: its test copies that file alone.)
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

REPO = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    """A benchmark that cannot go on: the scripts print its message, not a traceback."""


def logger(tag: str) -> Callable[[str], None]:
    """A `log(msg)` that writes `[TAG HH:MM:SS] msg` to stderr."""
    def log(msg: str) -> None:
        print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
    return log


def exit_on(*signals: int) -> None:
    """Turns each signal into SystemExit(128 + signal), so that `finally` blocks and context
    managers stop the processes a script started."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    for s in signals:
        signal.signal(s, handler)


def proc_field(path: str, key: str) -> Optional[str]:
    """The value after `key:` in a /proc file (/proc/cpuinfo, /proc/meminfo,
    /proc/PID/status), stripped; None when the file or the key is not there."""
    try:
        with open(path) as f:
            for line in f:
                k, sep, v = line.partition(":")
                if sep and k.strip() == key:
                    return v.strip()
    except OSError:
        pass
    return None


def status_kib(field: str, pid="self") -> int:
    """A memory figure of /proc/PID/status in KiB (VmRSS: resident now; VmHWM: its peak);
    0 when absent."""
    v = proc_field(f"/proc/{pid}/status", field)
    return int(v.split()[0]) if v else 0


def self_cpu_s() -> float:
    """User + system CPU seconds of this process (all its threads), to the microsecond
    (getrusage; /proc's ticks in `cpu_s` are 10 ms)."""
    return _rusage_cpu_s(resource.RUSAGE_SELF)


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's children that have been reaped: what a
    pass that starts and reaps its own processes (dquant.torch.DataLoader's workers) spent
    in them."""
    return _rusage_cpu_s(resource.RUSAGE_CHILDREN)


def _rusage_cpu_s(who: int) -> float:
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def cpu_s(pid: int, gone: Optional[float] = None) -> float:
    """User + system CPU seconds of process `pid` (all its threads, those that ended too), to
    the nanosecond: its CPU-time clock (clock_getcpuclockid), as dquant-offload-bench's
    procs::proc_cpu reads it. /proc/PID/stat has the same time in 10 ms ticks, too coarse
    for the two readings around a short measurement. A process that is gone raises, or gives
    `gone` when that is a number."""
    clock = ctypes.c_int()
    rc = ctypes.CDLL(None, use_errno=True).clock_getcpuclockid(pid, ctypes.byref(clock))
    try:
        if rc != 0:
            raise OSError(rc, f"no CPU clock for process {pid}: {os.strerror(rc)}")
        return time.clock_gettime(clock.value)
    except OSError:
        if gone is None:
            raise
        return gone


def median(xs: Iterable[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: list[float], f: Callable[[float], str]) -> str:
    """`lo–hi` of runs, each formatted by `f`; one figure when both read the same."""
    lo, hi = f(min(xs)), f(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def git_commit() -> str:
    """HEAD's short hash, or "?"."""
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def figures_table(figures: list[dict]) -> str:
    """A Markdown table of figures as bench/results.py takes them: name, value and unit,
    baseline, goal."""
    rows = [f"| {f['name']} | {f['value']} {f['unit']} | {f['baseline']} | {f['goal'] or ''} |" for f in figures]
    return "\n".join(["| figure | value | baseline | goal |", "|---|---:|---|---|", *rows])


def history_head(title: str, command: str, detail: str) -> str:
    """The heading of a run's section in bench/history/AREA.md: when, what, the command, the
    commit and `detail`."""
    import datetime
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"## {when}: {title}\n\n`{command}` · commit {git_commit()} · {detail}\n\n"


def record(area: str, figures: list[dict], command: str, history: str, *args: str) -> bool:
    """`figures` recorded as AREA's result by bench/results.py (which fills in the commit, date
    and machine, and renders RESULTS.md; `args`: more of its `record` options), then `history`
    appended to bench/history/AREA.md. False, with nothing appended, when results.py refused
    (it said why on stderr)."""
    sys.path.insert(0, str(REPO / "bench"))
    import results

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"figures": figures}, fh)
    try:
        code = results.main(["record", area, "--figures", fh.name, "--command", command, *args])
    finally:
        os.unlink(fh.name)
    if code != 0:
        return False
    with open(REPO / "bench" / "history" / f"{area}.md", "a") as h:
        h.write(history)
    return True


def figure(name: str, value: float, unit: str, baseline: str, goal: Optional[str]) -> dict:
    """One figure as bench/results.py takes it."""
    return {"name": name, "value": value, "unit": unit, "baseline": baseline, "goal": goal}


def load_json(out: Path, name: str):
    """`out/name` parsed, or None when the run did not write it (a step left out)."""
    p = out / name
    return json.loads(p.read_text()) if p.exists() else None


def by_case_and_cache(measurements: list[dict]) -> dict[tuple[str, bool], list[dict]]:
    """A `dquant-offload-bench ttfb` run's measurements grouped by (case, cold): the agent's
    and in-process, cold and warm."""
    by: dict[tuple[str, bool], list[dict]] = {}
    for m in measurements:
        by.setdefault((m["case"], m["cold"]), []).append(m)
    return by


def figures_main(area: str, doc: str, figures: Callable[[Path], list[dict]], expected: int,
                 record_args: list[str], extra: Callable[[Path], str] = lambda out: "") -> int:
    """The command line of a run's figures script (bench/AREA/figures.py, `doc` its module
    doc): prints the figures of an output directory as a table, and with --record records them
    as AREA (all `expected` of them needed, `record_args` more of results.py's options), with
    the table and `extra(out)` appended to bench/history/AREA.md."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("out", type=Path, help=f"a bench/{area}/run.sh output directory")
    ap.add_argument("--command", default=f"bench/{area}/run.sh --record")
    ap.add_argument("--record", action="store_true",
                    help=f"record the figures as the {area} area (every step's figures needed)")
    a = ap.parse_args()
    figs = figures(a.out)
    table = figures_table(figs)
    print(table)
    if not a.record:
        return 0
    if len(figs) != expected:
        print(f"error: {len(figs)} of the {expected} figures in {a.out}: record a run of every "
              "step", file=sys.stderr)
        return 1
    history = history_head(area, a.command, f"output {a.out}") + table + "\n\n" + extra(a.out)
    return 0 if record(area, figs, a.command, history, *record_args) else 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    """`dquant serve --listen --data-listen` on loopback plus the caller's flags (`args`).
    `start()` waits for its banner (and reads `uri` from it); `stop()` signals it, then kills
    it if it lingers; `close()` (or leaving a `with` block) also removes its private directory.
    `fixed`: free ports picked now, so a restart listens where its clients knew it. `socket`:
    also `--socket` in the private directory. `env`: variables for it. `logs`: the directory for
    its output, NAME.START.log (default the private one). `new_session`: a terminal's ^C reaches
    only the script, which then stops it. `host` and `prefix`: where it listens, and what runs
    it (`ip netns exec NS` for an agent inside a network namespace at the namespace's
    address; there, fixed ports are ports free here, which a fresh namespace has free too)."""

    def __init__(self, dquant, args: Iterable[str] = (), *, name: str = "dquant serve",
                 fixed: bool = False, socket: bool = False, env: Optional[dict] = None,
                 logs: Optional[Path] = None, new_session: bool = False,
                 host: str = "127.0.0.1", prefix: Iterable[str] = ()):
        port = (lambda: f"{host}:{free_port()}") if fixed else (lambda: f"{host}:0")
        self.control, self.data = port(), port()
        self.prefix = list(prefix)
        self.dquant, self.args, self.name = str(dquant), list(args), name
        self.env = {**os.environ, **env} if env else None
        self.dir = Path(tempfile.mkdtemp(prefix="dquant-agent-"))
        self.socket = str(self.dir / "agent.sock") if socket else None
        self.logs, self.new_session = logs or self.dir, new_session
        self.proc: Optional[subprocess.Popen] = None
        self.uri: Optional[str] = None
        self.starts = 0

    def start(self) -> "Agent":
        self.starts += 1
        log_path = self.logs / f"{self.name}.{self.starts}.log"
        flags = ["--listen", self.control, "--data-listen", self.data, *self.args]
        if self.socket:
            flags += ["--socket", self.socket]
        with open(log_path, "w") as out:
            self.proc = subprocess.Popen(
                [*self.prefix, self.dquant, "serve", *flags], stdin=subprocess.DEVNULL, stdout=out,
                stderr=out, env=self.env, start_new_session=self.new_session)
        deadline = time.monotonic() + 30
        while not (m := re.search(r"dquant agent listening: uri=(\S+)", log_path.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise BenchError(f"{self.name} did not start (exit {self.proc.returncode}):\n"
                                 f"{log_path.read_text()}")
            time.sleep(0.02)
        self.uri = m.group(1)
        return self

    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, wait: float = 10) -> None:
        """`sig` (SIGTERM: a graceful drain), then SIGKILL after `wait` seconds."""
        if self.up():
            self.proc.send_signal(sig)
        if self.proc is not None:
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Agent":
        try:
            return self if self.up() else self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()


def is_mounted(path: Path) -> bool:
    """Whether a `dquant mount` is mounted at `path`."""
    path = str(path.resolve())
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == path and " - fuse dquant:" in line for line in f)


class Mount:
    """A fresh `dquant mount` process (an empty page cache for its files)."""

    def __init__(self, dquant: Path, uri: str, at: Path, *args: str):
        at.mkdir(parents=True, exist_ok=True)
        self.at = at
        self.proc = subprocess.Popen(
            [str(dquant), "mount", uri, str(at), *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        t0 = time.monotonic()
        while not is_mounted(at):
            if self.proc.poll() is not None or time.monotonic() - t0 > 30:
                raise RuntimeError("dquant mount did not mount")
            time.sleep(0.02)

    def stop(self):
        gc.collect()  # a caller's memmaps of the mount (GPTDataset's)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            subprocess.run(["umount", "-l", str(self.at)], stderr=subprocess.DEVNULL)
            self.proc.kill()
            self.proc.wait()


def read_seq(path: Path) -> tuple[float, int]:
    """Seconds to read `path` whole in 1 MiB reads, and its bytes."""
    buf = bytearray(1 << 20)
    n = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while True:
            k = f.readinto(buf)
            if not k:
                break
            n += k
    return time.perf_counter() - t0, n


def timed_run(cmd: list[str]) -> tuple[float, str]:
    """Wall-clock seconds `cmd` took (process start included) and its stdout; a failure ends
    the script with the command and its stderr."""
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {p.stderr}")
    return dt, p.stdout
