"""PyTorch integration: :class:`TokenDataset`, an ``IterableDataset`` over a dquant plan, and
:class:`DataLoader`, the ``torch.utils.data.DataLoader`` that keeps its ``state_dict`` exact
while workers prefetch.

Sharding. Every global sample of the plan goes to exactly one (rank, DataLoader worker):
with ``R`` ranks of ``W`` workers each, the plan runs as ``R * W`` sub-ranks, and worker
``w`` of rank ``r`` is sub-rank ``r * W + w``. The plan's own sharding does this (global sample
``i`` goes to sub-rank ``i % (R * W)``), so there are no duplicates and no gaps, and the
blend's weights hold exactly as the plan defines them.

Resumption. The state is one cursor per sub-rank: the position after the last batch the
training loop *received* from it. Workers run ahead of the loop (``prefetch_factor``
batches each); what they produced but the loop never saw is produced again after a resume,
and nothing the loop saw is. The main process learns what it received from a small position
tag each batch carries, which :class:`DataLoader` removes before the batch reaches you; with
``num_workers=0`` the dataset sees its own batches and a plain ``torch.utils.data.DataLoader``
is enough. A resumed loader also continues the order in which workers' batches interleave,
so a resumed run sees exactly the stream the uninterrupted run would have seen.

    >>> from dquant.torch import TokenDataset, DataLoader
    >>> ds = TokenDataset({"sources": [{"uri": "data/r50k_int32"}], "seq_len": 2048,
    ...                    "batch_size": 8})
    >>> loader = DataLoader(ds, num_workers=3, pin_memory=True)
    >>> for step, batch in enumerate(loader):
    ...     loss = model(batch["input_ids"], labels=batch["labels"])
    ...     if step % 1000 == 0:
    ...         torch.save({"data": ds.state_dict(), ...}, "ckpt.pt")
    >>> ds.load_state_dict(torch.load("ckpt.pt")["data"])   # then iterate a new loader
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional

import torch
import torch.utils.data

import dquant

__all__ = ["TokenDataset", "DataLoader"]

_POSITION = "dquant_position"
_STATE_VERSION = 1
_DTYPES = ("int64", "raw")


def _distributed() -> Optional[tuple[int, int]]:
    """(rank, world size) from torch.distributed, when it is initialized."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


class TokenDataset(torch.utils.data.IterableDataset):
    """The batches of a dquant plan, as dicts of ``input_ids`` and ``labels``.

    Each item is one batch of the plan (``batch_size`` samples; the last may be short):
    ``{"input_ids": (B, seq_len), "labels": (B, seq_len)}``, labels shifted by one token.
    Use it with ``batch_size=None`` in the DataLoader (:class:`DataLoader` sets that).

    Args:
        plan: a plan dict, JSON text, a ``.json``/``.toml`` file, or one dataset URI (see
            :func:`dquant.plan_of`).
        agent: run the plan on this agent (``dquant://HOST:PORT`` or its Unix socket path)
            instead of in this process; see :func:`dquant.open`.
        offload: default: ``True`` when an agent is named (or the sources are ``dquant://``
            URIs of one agent), else ``False``.
        transport: ``"tcp"``, ``"shm"`` or ``None``; see :func:`dquant.open`.
        rank, world_size: this process's data-parallel rank and the number of ranks.
            Default: from ``torch.distributed`` when it is initialized, else the plan's
            ``rank``/``world`` (0 and 1 unless set).
        dtype: ``"int64"`` (default) for int64 tensors (the batches are then made as int64,
            whatever the plan's ``output``), or ``"raw"`` for the plan's output dtype
            (``uint16``/``int32``/``int64``). Either way ``input_ids`` and ``labels`` are
            views of one batch buffer, not copies.
        **fields: plan fields set on top of the plan (``seq_len=``, ``batch_size=``, ...).
    """

    def __init__(
        self,
        plan: Any,
        *,
        agent: Optional[str] = None,
        offload: Optional[bool] = None,
        transport: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        dtype: str = "int64",
        **fields: Any,
    ) -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, not {dtype!r}")
        self.plan = dquant.plan_of(plan, **fields)
        sources = self.plan.get("sources")
        uris = [s.get("uri", "") for s in sources] if isinstance(sources, list) else []
        names_agent = bool(uris) and all(
            isinstance(u, str) and u.startswith("dquant://") for u in uris
        )
        self.agent = agent
        self.offload = (agent is not None or names_agent) if offload is None else offload
        self.transport = transport
        self.dtype = dtype
        dist = _distributed()
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank and world_size, or neither")
        if rank is not None:
            self.rank, self.world_size = int(rank), int(world_size)
        elif dist is not None:
            self.rank, self.world_size = dist
        else:
            self.rank = int(self.plan.get("rank", 0))
            self.world_size = int(self.plan.get("world", 1))
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        # Fail now, in the main process, on a plan that cannot run; workers would only
        # fail later, one by one.
        dquant.open(
            self._plan_for(0, 1),
            offload=self.offload,
            transport=transport,
            agent=agent,
        ).close()
        # What the training loop has received: per sub-rank cursors, and which sub-rank's
        # batch comes next in the interleaving. `None` until the first batch or a load.
        self._state: Optional[Dict[str, Any]] = None
        # Set by dquant.torch.DataLoader: batches then carry their position to the main
        # process.
        self._tracked = False
        self._warned = False

    # -- sharding ------------------------------------------------------------------------

    def _plan_for(self, slot: int, workers: int) -> dict:
        """The plan of sub-rank ``slot`` of this rank's ``workers``. For int64 items the
        batches are made as int64 (the pipeline writes its output dtype in the pass it makes
        anyway), so the tensors are views of them rather than converted copies."""
        plan = dict(self.plan)
        plan["rank"] = self.rank * workers + slot
        plan["world"] = self.world_size * workers
        if self.dtype == "int64":
            plan["output"] = "i64"
        return plan

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None and not self._tracked and not self._warned:
            self._warned = True
            warnings.warn(
                "dquant TokenDataset in DataLoader workers: state_dict() in the main process "
                "only sees batches delivered through dquant.torch.DataLoader; use it instead "
                "of torch.utils.data.DataLoader to checkpoint the data position",
                stacklevel=2,
            )
        state = self._state_for(workers)
        slot = (worker + state["next_slot"]) % workers
        epoch, consumed = state["cursors"][slot]
        reader = dquant.open(
            self._plan_for(slot, workers),
            offload=self.offload,
            transport=self.transport,
            agent=self.agent,
            cursor={"epoch": epoch, "consumed_samples": consumed},
        )
        in_process = info is None
        try:
            for arr in reader:
                item = self._item(arr)
                epoch, consumed = arr.base.cursor
                if in_process:
                    # The loop receives this batch as soon as we yield it.
                    self._delivered(slot, epoch, consumed, workers)
                elif self._tracked:
                    item[_POSITION] = torch.tensor([slot, epoch, consumed], dtype=torch.int64)
                yield item
        finally:
            reader.close()
        if in_process:
            self._finished()

    def _item(self, arr) -> Dict[str, torch.Tensor]:
        t = torch.from_numpy(arr)  # shares the batch's memory
        return {"input_ids": t[:, :-1], "labels": t[:, 1:]}

    # -- state ---------------------------------------------------------------------------

    def _fresh_state(self, workers: int) -> Dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "plan": json.dumps(self.plan, sort_keys=True),
            "rank": self.rank,
            "world_size": self.world_size,
            "num_workers": workers,
            "next_slot": 0,
            "cursors": [[0, 0] for _ in range(workers)],
            "finished": False,
        }

    def _state_for(self, workers: int) -> Dict[str, Any]:
        """The state to start an iteration with ``workers`` sub-ranks."""
        s = self._state
        if s is None or s["finished"]:
            return self._fresh_state(workers)
        if s["num_workers"] != workers:
            # One sub-rank per rank stands for num_workers 0 (or 1).
            def loader_workers(n: int) -> int:
                return n if n > 1 else 0

            raise ValueError(
                f"TokenDataset: the data position was saved with {s['num_workers']} DataLoader "
                f"worker(s) (sub-ranks), this loader has {loader_workers(workers)}"
                f"; resume with num_workers={loader_workers(s['num_workers'])}"
            )
        return s

    def _delivered(self, slot: int, epoch: int, consumed: int, workers: int) -> None:
        if self._state is None or self._state["finished"]:
            self._state = self._fresh_state(workers)
        self._state["cursors"][slot] = [int(epoch), int(consumed)]
        self._state["next_slot"] = (slot + 1) % workers

    def _finished(self) -> None:
        """The loop received the whole stream: the next iteration starts over."""
        if self._state is not None:
            self._state["finished"] = True

    def state_dict(self) -> Dict[str, Any]:
        """Where the training loop is in the stream: pass it to :meth:`load_state_dict` to
        resume exactly after the last batch it received. Plain data (JSON-serializable)."""
        s = self._state if self._state is not None else self._fresh_state(0)
        return json.loads(json.dumps(s))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from :meth:`state_dict`'s result: the next iteration yields exactly the
        rest of the stream. The plan, rank, world size and number of DataLoader workers must
        be the ones the state was saved with."""
        try:
            version = state["version"]
            s = {k: state[k] for k in self._fresh_state(0)}
        except (KeyError, TypeError):
            raise ValueError(f"TokenDataset.load_state_dict: not a TokenDataset state: {state!r}") from None
        if version != _STATE_VERSION:
            raise ValueError(f"TokenDataset.load_state_dict: state version {version}, expected {_STATE_VERSION}")
        if s["plan"] != json.dumps(self.plan, sort_keys=True):
            raise ValueError("TokenDataset.load_state_dict: the state was saved for a different plan")
        if (s["rank"], s["world_size"]) != (self.rank, self.world_size):
            raise ValueError(
                f"TokenDataset.load_state_dict: the state is rank {s['rank']} of {s['world_size']}, "
                f"this dataset is rank {self.rank} of {self.world_size}"
            )
        n = s["num_workers"]
        if len(s["cursors"]) != n or not 0 <= s["next_slot"] < max(n, 1):
            raise ValueError("TokenDataset.load_state_dict: inconsistent state (cursors, next_slot)")
        if n == 0:
            # Saved before any batch: any number of workers may start it.
            self._state = None
            return
        self._state = json.loads(json.dumps(s))


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` for a :class:`TokenDataset` that keeps the dataset's
    ``state_dict`` exact under worker prefetch: it records each batch's position as the batch
    reaches the loop, and removes the tag. ``batch_size`` is the plan's (leave it ``None``);
    every other argument is torch's."""

    def __init__(self, dataset: TokenDataset, **kwargs: Any) -> None:
        if not isinstance(dataset, TokenDataset):
            raise TypeError(f"dquant.torch.DataLoader needs a TokenDataset, got {type(dataset).__name__}")
        if kwargs.get("batch_size") is not None:
            raise ValueError(
                "dquant.torch.DataLoader: batches come from the plan (its batch_size); leave "
                "the DataLoader's batch_size as None"
            )
        kwargs["batch_size"] = None
        dataset._tracked = True
        super().__init__(dataset, **kwargs)

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        ds: TokenDataset = self.dataset
        workers = max(self.num_workers, 1)
        it = super().__iter__()
        for batch in it:
            pos = batch.pop(_POSITION, None)
            if pos is not None:
                slot, epoch, consumed = (int(x) for x in pos.tolist())
                ds._delivered(slot, epoch, consumed, workers)
            yield batch
        if self.num_workers > 0:
            ds._finished()
