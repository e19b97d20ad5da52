"""dquant.torch.DataLoader's ring workers, for a plan that runs in-process: each worker makes
its batches in Rust straight into a shared-memory ring that the loop reads in place.

Moving a batch from a worker process to the loop through Python (pickling, a queue, even a
shared slot laid out and described from Python) costs more per batch than making it. So a
ring worker is a small agent. For each pass, the loop's process creates a ring per worker, as
it does for an agent's session over shared memory, and hands it over on a socket pair; the
worker runs its sub-rank's plan (``dquant._dquant.serve_loader_ring``) and makes every batch
record straight into a slot, and the loop reads the slots through an ordinary
:class:`dquant.Reader` (``open_loader_ring``). No Python runs per batch in the worker; the
loop does what the in-process loop does, minus making the batch.

The processes outlive a pass when the loader asks for ``persistent_workers``: between passes
each waits on its control socket for the next pass's plan, cursor and ring socket, so a pass
costs a ring and a plan opened per worker rather than a fork of the training process. A
worker's exception goes to the loop pickled on a pipe of its own (its message went with the
ring already) and the worker exits; a pool with a worker gone is not used again.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import socket
import struct
from typing import Any, Dict, List

import dquant
from dquant._sessions import Sessions
from dquant._workers import JOIN_S, died, reap, wrapped

# Most slots in a worker's ring (fewer when 16 batches pass 8 MiB). Eight times torch's
# prefetch_factor of 2, so a worker runs ahead through the loop's hiccups; not more, because
# each pass maps its rings afresh (a page fault a page on each side) and because a ring the
# caches still hold is faster to write and read: on 2 vCPU, 16 slots of 8 x 2048 i64 batches
# gave 1 to 4 workers 1.1-1.4x the rate of 64 (an agent's ring of 8 MiB), and 4 slots 0.5-1x.
SLOTS = 16

# A pass's message to a worker: its length (u32, little-endian), then JSON [plan, cursor].
_LEN = struct.Struct("<I")


def enabled() -> bool:
    """Whether in-process plans run on :class:`RingWorkers` (``DQUANT_WORKER_RING``)."""
    return os.environ.get("DQUANT_WORKER_RING", "1") not in ("0", "false", "no", "off")


def _next_pass(ctl: socket.socket):
    """The next pass's ``(plan, cursor, ring socket fd)`` from the loop, or ``None`` when the
    loop hung up."""
    head, fds, _, _ = socket.recv_fds(ctl, 1 << 16, 1)
    if not head:
        return None
    if len(fds) != 1 or len(head) < _LEN.size:
        raise RuntimeError(f"dquant DataLoader worker: a malformed pass message ({len(head)} bytes, {len(fds)} fds)")
    (n,) = _LEN.unpack_from(head)
    body = bytearray(head[_LEN.size:])
    while len(body) < n:
        more = ctl.recv(n - len(body))
        if not more:
            return None
        body += more
    plan, cursor = json.loads(body)
    return plan, cursor, fds[0]


def _serve(slot: int, ctl: socket.socket, errors: int, inherited) -> None:
    """A ring worker process: for each pass the loop sends on ``ctl``, sub-rank ``slot``'s
    batches into that pass's ring; an exception goes to the loop pickled on the pipe
    ``errors``, and ends the process."""
    for other in inherited:  # the loop's ends of the control sockets made so far
        other.close()
    # As torch's workers: the loop's Ctrl-C is the main process's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while True:
            got = _next_pass(ctl)
            if got is None:
                return
            plan, cursor, fd = got
            dquant._dquant.serve_loader_ring(plan, cursor, fd)
    except BaseException:
        try:
            os.write(errors, pickle.dumps(wrapped(slot)))
        except OSError:
            pass
        raise SystemExit(1) from None


class RingWorkers(Sessions):
    """The ring worker processes of a :class:`dquant.torch.TokenDataset`'s sub-ranks. Each
    :meth:`run` is one pass (:class:`dquant._sessions.Sessions`'s, over the workers' rings).
    :meth:`close` reaps the processes; until then they wait for the next pass."""

    def __init__(self, ds, workers: int, timeout: float = 0) -> None:
        super().__init__(ds, workers, timeout)
        self.procs: Dict[int, Any] = {}
        self.ctls: Dict[int, socket.socket] = {}
        self.errors: Dict[int, int] = {}
        ctx = multiprocessing.get_context("fork")
        try:
            for slot in range(workers):
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                self.ctls[slot] = ours
                err_r, err_w = os.pipe2(os.O_CLOEXEC)
                self.errors[slot] = err_r
                proc = ctx.Process(
                    target=_serve,
                    args=(slot, theirs, err_w, list(self.ctls.values())),
                    name=f"dquant-worker-{slot}",
                    daemon=True,
                )
                try:
                    proc.start()
                finally:
                    theirs.close()
                    os.close(err_w)
                self.procs[slot] = proc
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        """Whether every worker is there for another pass."""
        return bool(self.procs) and all(p.is_alive() for p in self.procs.values())

    def _hand_out(self, state) -> None:
        """Sends every worker its pass (its sub-rank's plan and cursor, and a socket to hand
        the ring over on), then opens each ring as the worker's plan opens."""
        plans = [json.dumps(self.ds._plan_for(slot, self.n)) for slot in range(self.n)]
        socks: Dict[int, socket.socket] = {}
        try:
            for slot in range(self.n):
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                socks[slot] = ours
                cursor = dquant._cursor_json(state["cursors"][slot])
                body = json.dumps([plans[slot], cursor]).encode()
                try:
                    socket.send_fds(self.ctls[slot], [_LEN.pack(len(body)) + body], [theirs.fileno()])
                except OSError as e:
                    raise self._failed(slot, e) from None
                finally:
                    theirs.close()
            # Every worker opens its plan at once; each reader waits for its own.
            for slot in range(self.n):
                try:
                    self.readers[slot] = dquant._dquant.open_loader_ring(
                        plans[slot], socks.pop(slot).detach(), SLOTS
                    )
                except dquant.AgentError as e:  # what the worker said, or that it went away
                    raise self._failed(slot, e) from None
        finally:
            for sock in socks.values():
                sock.close()

    def _failed(self, slot: int, e: BaseException) -> BaseException:
        """What to raise for worker ``slot``'s stream ending in ``e``: the worker's own
        exception if it sent one, the way it died if it died, else ``e``."""
        proc = self.procs[slot]
        proc.join(JOIN_S)
        try:
            os.set_blocking(self.errors[slot], False)
            sent = os.read(self.errors[slot], 1 << 20)
        except OSError:
            sent = b""
        if sent:
            try:
                pickle.loads(sent).reraise()
            except BaseException as raised:  # noqa: B036: the worker's, to raise in the loop
                return raised
        if proc.exitcode is not None and proc.exitcode < 0:
            return died(slot, proc)
        return e

    def close(self) -> None:
        """Ends the pass, then hangs up on every worker and reaps it (killing one that does
        not exit in time)."""
        self.end_pass()
        for ctl in self.ctls.values():
            ctl.close()
        reap(self.procs.values())
        for fd in self.errors.values():
            os.close(fd)
        self.procs, self.ctls, self.errors = {}, {}, {}

    def pids(self) -> List[int]:
        return [p.pid for p in self.procs.values() if p.pid]
