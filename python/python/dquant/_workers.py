"""dquant.torch.DataLoader's own worker processes: no per-batch work of torch's worker
machinery, and for a plan that runs in-process none of Python's either.

torch's DataLoader runs each batch of a worker through two multiprocessing queues (an index
out, a result back), each with a feeder thread, a pickling and a wake-up on both sides: about
160 us a batch in each process on 2 vCPU, whatever the batch holds. A TokenDataset needs none
of it: the plan already says which sub-rank every batch comes from, so there are no indices to
send. Two kinds of workers here:

* :class:`dquant._ring_workers.RingWorkers`, for a plan that runs in-process (the usual
  case): each worker makes its batches in Rust straight into a shared-memory ring the loop
  reads in place, so no Python runs per batch in the worker (see that module).
* :class:`Workers`, with ``DQUANT_WORKER_RING=0``: each worker runs its sub-rank through
  Python and writes every batch into a slot of its shared memory (:mod:`dquant._handoff`)
  and the slot's pickled layout, a few hundred bytes, to a socket of its own; the socket's
  small send buffer is the prefetch bound.

A plan an agent runs has no worker processes at all: its sub-ranks are sessions of the agent,
read in the loop's process (:mod:`dquant._sessions`).

Either way the loop reads the workers in the order torch's DataLoader interleaves them (round
robin from the state's next sub-rank, a worker that has ended dropping out), so the stream is
torch's batch for batch. A worker that fails has its exception raised in the loop as torch
would; one that dies is an error naming it, never a short epoch. Closing the pass (its end, a
``break``, an exception, the iterator dropped) closes every worker's stream and reaps it
(ring workers with ``persistent_workers=True`` wait for the next pass instead).
This module holds :class:`Workers` and what both kinds share.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import socket
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch._utils import ExceptionWrapper


# The first byte of each message.
_ITEM, _END, _ERROR = b"I", b"E", b"X"
# Each worker's socket buffers (send and receive): with messages of a few hundred bytes this
# lets a worker run a handful of batches ahead, as torch's prefetch_factor of 2 does.
BUFFER = 4096
# How long a pass's end waits for its workers to exit before it kills them.
JOIN_S = 5.0


def _small_buffers(conn: Connection) -> None:
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
    finally:
        sock.close()


def _work(ds, slot: int, workers: int, cursor: Dict[str, Any], conn: Connection, inherited) -> None:
    """A worker process: sub-rank ``slot``'s batches into ``conn``, then wait to be let go."""
    for other in inherited:  # the main process's ends of the sockets made before this one
        other.close()
    # As torch's workers: the loop's Ctrl-C is the main process's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    try:
        for item in ds._batches(slot, workers, cursor, in_process=False):
            conn.send_bytes(_ITEM + pickle.dumps(item, pickle.HIGHEST_PROTOCOL))
        conn.send_bytes(_END)
    except (BrokenPipeError, ConnectionResetError):
        return  # the main process hung up: the pass is over
    except BaseException:
        try:
            conn.send_bytes(_ERROR + pickle.dumps(wrapped(slot)))
        except OSError:
            return
    # The main process maps this process's shared memory through /proc/PID/fd when it first
    # reads a batch of it: stay until it hangs up.
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        pass


def interleave(order: List[int], take: Callable[[int], Any]) -> Iterator[Tuple[int, Any]]:
    """torch's interleaving of its workers: round robin over the sub-ranks in ``order`` (from
    the state's next one), each item ``take(slot)``, a sub-rank whose ``take`` gives ``None``
    dropping out. Yields ``(slot, item)``."""
    order, i = list(order), 0
    while order:
        slot = order[i]
        item = take(slot)
        if item is None:
            order.pop(i)
            i = i % len(order) if order else 0
            continue
        i = (i + 1) % len(order)
        yield slot, item


def reap(procs) -> None:
    """Waits for each of ``procs`` to exit, killing one that does not within ``JOIN_S``."""
    for proc in procs:
        proc.join(JOIN_S)
        if proc.exitcode is None:
            proc.kill()
            proc.join()


def wrapped(slot: int) -> ExceptionWrapper:
    """The exception being handled in worker ``slot``, wrapped as torch wraps a worker's, for
    the loop to raise (``reraise``)."""
    return ExceptionWrapper(where=f"in dquant DataLoader worker {slot} (pid {os.getpid()})")


def died(slot: int, proc) -> RuntimeError:
    """The error for worker ``slot``'s process ``proc`` gone before the end of its batches."""
    return RuntimeError(
        f"dquant DataLoader worker {slot} (pid {proc.pid}) {_exit_text(proc)} before the end "
        "of its batches"
    )


def timed_out(timeout: float) -> RuntimeError:
    """torch's error for a worker that sent nothing within the loader's ``timeout``."""
    return RuntimeError(f"DataLoader timed out after {timeout} seconds")


def _exit_text(proc) -> str:
    code = proc.exitcode
    if code is None:
        return "closed its socket"
    if code < 0:
        try:
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class Workers:
    """The worker processes of one pass over a :class:`dquant.torch.TokenDataset`'s
    sub-ranks, and the batches they send, in torch's interleaving. Iterate it once; it closes
    when the iteration ends, however it ends."""

    def __init__(self, ds, workers: int, timeout: float = 0) -> None:
        state = ds._state_for(workers)
        self.timeout = timeout
        # Sub-ranks in the order their batches interleave: from the state's next one on.
        self.order = [(state["next_slot"] + i) % workers for i in range(workers)]
        self.conns: Dict[int, Connection] = {}
        self.procs: Dict[int, Any] = {}
        ctx = multiprocessing.get_context("fork")
        try:
            for slot in range(workers):
                ours, theirs = ctx.Pipe(duplex=True)
                _small_buffers(theirs)
                _small_buffers(ours)
                proc = ctx.Process(
                    target=_work,
                    args=(ds, slot, workers, state["cursors"][slot], theirs,
                          [ours, *self.conns.values()]),
                    name=f"dquant-worker-{slot}",
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self.conns[slot], self.procs[slot] = ours, proc
        except BaseException:
            self.close()
            raise

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        try:
            for _, item in interleave(self.order, self._take):
                yield item
        finally:
            self.close()

    def _take(self, slot: int) -> Optional[Dict[str, Any]]:
        """Worker ``slot``'s next batch, ``None`` at its end; its exception, raised."""
        kind, body = self._receive(slot)
        if kind == _END:
            return None
        if kind == _ERROR:
            pickle.loads(body).reraise()
        return pickle.loads(body)

    def _receive(self, slot: int) -> tuple[bytes, bytes]:
        conn = self.conns[slot]
        if self.timeout > 0 and not conn.poll(self.timeout):
            raise timed_out(self.timeout)
        try:
            msg = conn.recv_bytes()
        except (EOFError, ConnectionResetError):
            proc = self.procs[slot]
            proc.join(JOIN_S)
            raise died(slot, proc) from None
        kind, body = msg[:1], msg[1:]
        if kind not in (_ITEM, _END, _ERROR):
            raise RuntimeError(f"dquant DataLoader worker {slot}: a message of unknown kind {kind!r}")
        return kind, body

    def close(self) -> None:
        """Hangs up on every worker and reaps it (killing one that does not exit in time)."""
        for conn in self.conns.values():
            conn.close()
        reap(self.procs.values())
        self.conns, self.procs = {}, {}

    def pids(self) -> List[int]:
        return [p.pid for p in self.procs.values() if p.pid]


def fits(loader: torch.utils.data.DataLoader, default_collate) -> Optional[str]:
    """Why ``loader``'s workers must be torch's own (``None``: dquant's can serve it)."""
    if loader.worker_init_fn is not None:
        return "a worker_init_fn"
    if loader.collate_fn is not default_collate:
        return "a collate_fn"
    ctx = loader.multiprocessing_context
    if ctx is not None and getattr(ctx, "get_start_method", lambda: ctx)() != "fork":
        return "a multiprocessing_context other than fork"
    if "fork" not in multiprocessing.get_all_start_methods():
        return "no fork on this platform"
    return None

