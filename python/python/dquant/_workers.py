"""dquant.torch.DataLoader's own worker processes: no per-batch work of torch's worker
machinery, and for a plan that runs in-process none of Python's either.

torch's DataLoader runs each batch of a worker through two multiprocessing queues (an index
out, a result back), each with a feeder thread, a pickling and a wake-up on both sides: about
160 us a batch in each process on 2 vCPU, whatever the batch holds. A TokenDataset needs none
of it: the plan already says which sub-rank every batch comes from, so there are no indices to
send. Two kinds of workers here:

* :class:`RingWorkers`, for a plan that runs in-process (the usual case): each worker is a
  small agent. The loop's process creates a shared-memory ring for it and hands it over on a
  socket pair; the worker runs its sub-rank's plan in Rust and makes every batch record
  straight into a slot (``dquant._dquant.serve_loader_ring``), and the loop reads the slots in
  place through an ordinary :class:`dquant.Reader` (``open_loader_ring``), as it reads an
  agent's ring. No Python runs per batch in the worker, and the loop's part is the in-process
  loop's minus making the batch.
* :class:`Workers`, for a plan an agent runs (the worker's reader is then a session of the
  agent's): each worker writes every batch into a slot of its shared memory
  (:mod:`dquant._handoff`) and the slot's pickled layout, a few hundred bytes, to a socket of
  its own; the socket's small send buffer is the prefetch bound.

Either way the loop reads the workers in the order torch's DataLoader interleaves them (round
robin from the state's next sub-rank, a worker that has ended dropping out), so the stream is
torch's batch for batch. A worker that fails has its exception raised in the loop as torch
would; one that dies is an error naming it, never a short epoch. Closing the pass (its end, a
``break``, an exception, the iterator dropped) closes every worker's stream and reaps it.
``DQUANT_WORKER_RING=0`` runs :class:`Workers` for in-process plans too.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import socket
from multiprocessing.connection import Connection
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch._utils import ExceptionWrapper

import dquant

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
        wrapped = ExceptionWrapper(where=f"in dquant DataLoader worker {slot} (pid {os.getpid()})")
        try:
            conn.send_bytes(_ERROR + pickle.dumps(wrapped))
        except OSError:
            return
    # The main process maps this process's shared memory through /proc/PID/fd when it first
    # reads a batch of it: stay until it hangs up.
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        pass


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
            order, i = list(self.order), 0
            while order:
                slot = order[i]
                kind, body = self._receive(slot)
                if kind == _END:
                    order.pop(i)
                    i = i % len(order) if order else 0
                    continue
                if kind == _ERROR:
                    pickle.loads(body).reraise()
                i = (i + 1) % len(order)
                yield pickle.loads(body)
        finally:
            self.close()

    def _receive(self, slot: int) -> tuple[bytes, bytes]:
        conn = self.conns[slot]
        if self.timeout > 0 and not conn.poll(self.timeout):
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds")
        try:
            msg = conn.recv_bytes()
        except (EOFError, ConnectionResetError):
            proc = self.procs[slot]
            proc.join(JOIN_S)
            raise RuntimeError(
                f"dquant DataLoader worker {slot} (pid {proc.pid}) {_exit_text(proc)} before "
                "the end of its batches"
            ) from None
        kind, body = msg[:1], msg[1:]
        if kind not in (_ITEM, _END, _ERROR):
            raise RuntimeError(f"dquant DataLoader worker {slot}: a message of unknown kind {kind!r}")
        return kind, body

    def close(self) -> None:
        """Hangs up on every worker and reaps it (killing one that does not exit in time)."""
        for conn in self.conns.values():
            conn.close()
        for proc in self.procs.values():
            proc.join(JOIN_S)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        self.conns, self.procs = {}, {}

    def pids(self) -> List[int]:
        return [p.pid for p in self.procs.values() if p.pid]


def rings_enabled() -> bool:
    """Whether in-process plans run on :class:`RingWorkers` (``DQUANT_WORKER_RING``)."""
    return os.environ.get("DQUANT_WORKER_RING", "1") not in ("0", "false", "no", "off")


def _serve(slot: int, plan: str, cursor: str, sock: socket.socket, errors: int, inherited) -> None:
    """A ring worker process: sub-rank ``slot``'s batches into the ring the loop hands over on
    ``sock``; an exception goes to the loop pickled on the pipe ``errors`` (its message went
    with the ring already)."""
    for other in inherited:  # the loop's ends of the sockets made before this one
        other.close()
    # As torch's workers: the loop's Ctrl-C is the main process's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        dquant._dquant.serve_loader_ring(plan, cursor, sock.detach())
    except BaseException:
        wrapped = ExceptionWrapper(where=f"in dquant DataLoader worker {slot} (pid {os.getpid()})")
        try:
            os.write(errors, pickle.dumps(wrapped))
        except OSError:
            pass
        raise SystemExit(1) from None


class RingWorkers:
    """The ring worker processes of one pass over a :class:`dquant.torch.TokenDataset`'s
    sub-ranks whose plan runs in-process, and their batches in torch's interleaving (see the
    module docs). Iterate it once; it closes when the iteration ends, however it ends."""

    def __init__(self, ds, workers: int, timeout: float = 0, slots: int = 0) -> None:
        state = ds._state_for(workers)
        self.ds, self.n, self.timeout = ds, workers, timeout
        self.order = [(state["next_slot"] + i) % workers for i in range(workers)]
        self.procs: Dict[int, Any] = {}
        self.readers: Dict[int, Any] = {}
        self.errors: Dict[int, int] = {}
        # Sub-ranks that delivered a batch since the dataset's state last took their cursors,
        # the last one last (see sync).
        self.delivered: Dict[int, None] = {}
        plans = [json.dumps(ds._plan_for(slot, workers)) for slot in range(workers)]
        socks: Dict[int, socket.socket] = {}
        ctx = multiprocessing.get_context("fork")
        try:
            for slot in range(workers):
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                socks[slot] = ours
                err_r, err_w = os.pipe2(os.O_CLOEXEC)
                self.errors[slot] = err_r
                cursor = dquant._cursor_json(state["cursors"][slot])
                proc = ctx.Process(
                    target=_serve,
                    args=(slot, plans[slot], cursor, theirs, err_w, list(socks.values())),
                    name=f"dquant-worker-{slot}",
                    daemon=True,
                )
                try:
                    proc.start()
                finally:
                    theirs.close()
                    os.close(err_w)
                self.procs[slot] = proc
            # Every worker opens its plan at once; each reader waits for its own.
            for slot in range(workers):
                sock = socks.pop(slot)
                try:
                    self.readers[slot] = dquant._dquant.open_loader_ring(
                        plans[slot], sock.detach(), slots
                    )
                except dquant.AgentError as e:  # what the worker said, or that it went away
                    raise self._failed(slot, e) from None
        except BaseException:
            for sock in socks.values():
                sock.close()
            self.close()
            raise
        ds._ring_pass = self

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        item = self.ds._item
        try:
            order, i = list(self.order), 0
            while order:
                slot = order[i]
                arr = self._next(slot)
                if arr is None:
                    order.pop(i)
                    i = i % len(order) if order else 0
                    continue
                i = (i + 1) % len(order)
                self.delivered.pop(slot, None)
                self.delivered[slot] = None
                yield item(arr)
        finally:
            self.close()

    def _next(self, slot: int):
        """Worker ``slot``'s next batch (``None`` at its end), waiting at most the timeout."""
        reader = self.readers[slot]
        try:
            if self.timeout > 0 and not reader.wait(self.timeout):
                raise TimeoutError
            return reader.next_batch()
        except TimeoutError:
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from None
        except Exception as e:
            raise self._failed(slot, e) from None

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
            return RuntimeError(
                f"dquant DataLoader worker {slot} (pid {proc.pid}) {_exit_text(proc)} before "
                "the end of its batches"
            )
        return e

    def sync(self) -> None:
        """Gives the dataset the cursor of every sub-rank that delivered since the last call,
        the last one to deliver last (it says which sub-rank comes next)."""
        for slot in list(self.delivered):
            reader = self.readers.get(slot)
            if reader is not None and not reader.closed:
                self.ds._delivered(slot, reader.cursor(), self.n)
        self.delivered.clear()

    def close(self) -> None:
        """Closes every worker's ring and reaps it (killing one that does not exit in time)."""
        if getattr(self.ds, "_ring_pass", None) is self:
            self.sync()
            self.ds._ring_pass = None
        for reader in self.readers.values():
            reader.close()
        for proc in self.procs.values():
            proc.join(JOIN_S)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        for fd in self.errors.values():
            os.close(fd)
        self.readers, self.procs, self.errors = {}, {}, {}

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

