"""A pass of dquant.torch.DataLoader over a TokenDataset's sub-ranks, read in the loop's own
process: one reader per sub-rank, taken in torch's interleaving.

For a plan an agent runs, this is the whole of the loader's workers: the agent is already the
process that makes the batches, and each sub-rank is a session of it, with its own producer
thread and prefetch. A worker process there would only receive each batch from the agent and
pass it on (a copy into its shared memory, a message, a mapping in the loop), which cost
two-thirds of the rate of reading the agent directly (0.3-0.4x over shared memory on 2 vCPU).
So ``num_workers=N`` opens N sessions, and the batches, their order, ``state_dict`` and a
resume are the ones torch's N workers give.

:class:`dquant._ring_workers.RingWorkers` reads its workers' rings through the same pass: only
where its readers come from, and what a failure means, differ.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

from dquant._workers import interleave, timed_out


class Sessions:
    """The sub-ranks of a :class:`dquant.torch.TokenDataset`, each a reader in this process.
    Each :meth:`run` is one pass: the batches, in torch's interleaving (round robin from the
    state's next sub-rank, one that has ended dropping out)."""

    def __init__(self, ds, workers: int, timeout: float = 0) -> None:
        self.ds, self.n, self.timeout = ds, workers, timeout
        self.readers: Dict[int, Any] = {}
        # Sub-ranks that delivered a batch since the dataset's state last took their cursors,
        # the last one last (see sync).
        self.delivered: Dict[int, None] = {}

    def alive(self) -> bool:
        """Whether it can run another pass (a session is opened each pass)."""
        return True

    def run(self) -> Iterator[Dict[str, Any]]:
        """One pass over the dataset's sub-ranks from its state's cursors."""
        state = self.ds._state_for(self.n)
        order = [(state["next_slot"] + i) % self.n for i in range(self.n)]
        item = self.ds._item
        try:
            self._hand_out(state)
            self.ds._ring_pass = self
            for slot, arr in interleave(order, self._next):
                self.delivered.pop(slot, None)
                self.delivered[slot] = None
                yield item(arr)
        finally:
            self.end_pass()

    def _hand_out(self, state) -> None:
        """Opens every sub-rank's reader at its cursor."""
        for slot in range(self.n):
            self.readers[slot] = self.ds._open(slot, self.n, state["cursors"][slot])

    def _next(self, slot: int):
        """Sub-rank ``slot``'s next batch (``None`` at its end), waiting at most the timeout."""
        reader = self.readers[slot]
        try:
            if self.timeout > 0 and not reader.wait(self.timeout):
                raise TimeoutError
            return reader.next_batch()
        except TimeoutError:
            raise timed_out(self.timeout) from None
        except Exception as e:
            raise self._failed(slot, e) from None

    def _failed(self, slot: int, e: BaseException) -> BaseException:
        """What to raise for sub-rank ``slot``'s stream ending in ``e``: ``e`` itself (the
        agent's error, or the transport's)."""
        return e

    def sync(self) -> None:
        """Gives the dataset the cursor of every sub-rank that delivered since the last call,
        the last one to deliver last (it says which sub-rank comes next)."""
        for slot in list(self.delivered):
            reader = self.readers.get(slot)
            if reader is not None and not reader.closed:
                self.ds._delivered(slot, reader.cursor(), self.n)
        self.delivered.clear()

    def end_pass(self) -> None:
        """Ends the running pass: the dataset takes its cursors, and every reader is closed
        (a session, or a ring worker's ring: the worker stops and waits for the next pass)."""
        if getattr(self.ds, "_ring_pass", None) is self:
            self.sync()
            self.ds._ring_pass = None
        for reader in self.readers.values():
            reader.close()
        self.readers = {}
        self.delivered.clear()

    def close(self) -> None:
        """Ends the pass."""
        self.end_pass()

    def pids(self) -> List[int]:
        """No processes: the agent makes the batches."""
        return []
