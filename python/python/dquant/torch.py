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

Under torchdata's ``StatefulDataLoader`` the loader keeps the position: in each worker,
``state_dict()`` is that worker's sub-rank's cursor after the batch it just made, which the
loader stores with the batch and hands back to the same worker's ``load_state_dict()`` on
resume. Under torch's own ``DataLoader`` with workers nothing in the loop's process sees a
batch's position, so ``state_dict()`` there raises rather than return the pass's start: a
state that silently rewinds would repeat every batch since.

Elastic resume. A job that restarts on another number of ranks or workers loads the list of
every rank's state (``ds.load_state_dict([s0, s1, ...])``, or one state from
:meth:`TokenDataset.merge_states`): the sub-ranks' cursors merge into one cursor, which lists
what faster workers delivered past the slowest, and the new ranks share the rest of the stream
with nothing lost and nothing repeated.

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
import logging
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Union

import torch
import torch.utils.data
from torch.utils.data._utils.collate import default_convert as _default_convert
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

import dquant
from dquant import _handoff, _ring_workers, _sessions, _to_device, _workers

__all__ = ["TokenDataset", "DataLoader"]

_POSITION = "dquant_position"
_log = logging.getLogger("dquant")
_STATE_VERSION = 2
_DTYPES = ("int64", "raw")
_NAMES = ("hf", "megatron")


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

    Boundary outputs. A plan with ``boundaries`` (``"eod"`` with ``eod=ID``, or
    ``"documents"``) adds what it asks for, each ``(B, seq_len)`` unless said, in Megatron's
    dtypes: ``position_ids`` (int64, restarting at each document), ``loss_mask`` (float32, 0
    where the target is another document's first token), and with ``cu_seqlens``,
    ``cu_seqlens`` (int32, the documents of the batch's inputs laid end to end) and
    ``max_seqlen`` (an int32 scalar tensor). The agent ships only each sample's document
    starts; the arrays are expanded here.

    Provenance. A plan with ``provenance=True`` adds ``provenance``: int64 of shape
    ``(pieces, 5)``, one row per run of a sample's tokens inside one document,
    ``(sample, source, document, offset, length)`` (see ``dquant.locate``).

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
        names: ``"hf"`` (default) names the inputs ``input_ids``; ``"megatron"`` names them
            ``tokens``, as Megatron-Core's GPTDataset does.
        share: with an agent: read the plan as the agent's shared stream of this name, one
            stream for every process that passes the same name and plan. The
            tensor-parallel and pipeline ranks of one data-parallel rank pass the same
            ``rank``/``world_size`` (the data-parallel ones) and the same name (e.g.
            ``f"job42/dp{dp_rank}"``): the agent runs the plan once for all of them. With
            DataLoader workers, worker ``w`` shares ``f"{share}/w{w}"``.
        share_group: with ``share``: the processes that share it (the tensor-parallel group's
            size, say); the stream's first batch waits for all of them, so each gets the
            whole stream. 0: start at once.
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
        names: str = "hf",
        share: Optional[str] = None,
        share_group: int = 0,
        **fields: Any,
    ) -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, not {dtype!r}")
        if names not in _NAMES:
            raise ValueError(f"names must be one of {_NAMES}, not {names!r}")
        self.plan = dquant.plan_of(plan, **fields)
        sources = self.plan.get("sources")
        uris = [s.get("uri", "") for s in sources] if isinstance(sources, list) else []
        names_agent = bool(uris) and all(
            isinstance(u, str) and u.startswith("dquant://") for u in uris
        )
        self.agent = agent
        self.offload = (agent is not None or names_agent) if offload is None else offload
        self.transport = transport
        if share is not None and not self.offload:
            raise ValueError("share needs the plan to run on an agent (agent=..., offload=True)")
        self.share = share
        self.share_group = int(share_group)
        self.dtype = dtype
        self._inputs = "input_ids" if names == "hf" else "tokens"
        # Which of loss_mask (1) and position_ids (2) one call to the batch builds, and
        # whether cu_seqlens are asked for too.
        self._masks = bool(self.plan.get("loss_mask")) | 2 * bool(self.plan.get("position_ids"))
        self._cu_seqlens = bool(self.plan.get("cu_seqlens"))
        self._provenance = bool(self.plan.get("provenance"))
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
        # The cursor a fresh iteration starts every sub-rank at: the start, or a cursor merged
        # from a run on another topology.
        self._start: Dict[str, Any] = dict(_START)
        # Set by dquant.torch.DataLoader while its pass runs: batches from workers then carry
        # their position to the main process.
        self._tracked = False
        # Set (to 1) by a DataLoader worker that reads this dataset for a loader that does not
        # track positions (torch's own, torchdata's StatefulDataLoader), cleared when this
        # process knows the position again (a load, an in-process pass, a pass of dquant's
        # DataLoader). Shared memory, so the copies in workers, forked or spawned, reach the
        # loop's process: there it means state_dict() cannot know the position.
        self._read_by_workers = torch.zeros(1, dtype=torch.uint8).share_memory_()
        # In a worker: its sub-rank's stream ended, so the next pass (a persistent worker's
        # next epoch) starts over, unless a state is loaded first.
        self._pass_ended = False
        # What the last load_state_dict accepted.
        self.resume_note: Optional[str] = None
        # The in-process iteration's (slot, reader, workers), whose cursor is the loop's.
        self._live = None
        # The running pass of dquant.torch.DataLoader's ring workers or an agent's sessions,
        # whose readers' cursors are the loop's (dquant._sessions.Sessions).
        self._ring_pass = None

    def __getstate__(self) -> Dict[str, Any]:
        # DataLoader workers get a copy: without the in-process reader (not picklable, and
        # not theirs).
        d = dict(self.__dict__)
        d["_live"] = None
        d["_ring_pass"] = None
        return d

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
        if info is None:
            # The loop's own reader: this process sees every batch, and knows the position.
            self._read_by_workers[0] = 0
            return self._batches(0, 1, self._state_for(1)["cursors"][0], in_process=True)
        if not self._tracked:
            return self._worker_pass(info.id, info.num_workers)
        state = self._state_for(info.num_workers)
        slot = (info.id + state["next_slot"]) % info.num_workers
        return self._batches(slot, info.num_workers, state["cursors"][slot], in_process=False)

    def _worker_pass(self, worker: int, workers: int) -> Iterator[Dict[str, torch.Tensor]]:
        """Worker ``worker`` of ``workers`` of a loader that does not track positions (torch's
        own DataLoader, torchdata's StatefulDataLoader). The loop's process never sees where
        this worker's batches stand, so the worker marks the dataset as read by workers (its
        ``state_dict()`` there then raises), and keeps its own sub-rank's position:
        StatefulDataLoader takes it with ``state_dict()`` here after each batch and gives it
        back to this worker's ``load_state_dict()`` on resume. The worker's state names its
        sub-rank (``slot``), so a resumed worker goes on with the same one."""
        self._read_by_workers[0] = 1
        if self._pass_ended:
            # A persistent worker's next pass, after its stream ended: it starts over.
            self._state, self._start, self._pass_ended = None, dict(_START), False
        state = self._state_for(workers)
        slot = state.get("slot")
        if slot is None:
            slot = (worker + state["next_slot"]) % workers
            state = dict(state, slot=slot)
        self._state = state
        return self._batches(slot, workers, state["cursors"][slot], in_process=False)

    def _batches(
        self, slot: int, workers: int, cursor: Dict[str, Any], in_process: bool
    ) -> Iterator[Dict[str, torch.Tensor]]:
        """Sub-rank ``slot`` of ``workers``'s batches from ``cursor`` on: in this process (the
        loop's own reader), or in a DataLoader worker (torch's or dquant's), where each batch
        carries its position when the loader tracks it and crosses to the loop through a slot
        of the worker's shared memory."""
        reader = self._open(slot, workers, cursor)
        tag = not in_process and self._tracked
        if not tag:
            # The loop (or, in a worker, StatefulDataLoader's snapshot) takes each batch as
            # soon as it is yielded, so the reader's own cursor is the position: state_dict()
            # reads it when asked, rather than every batch paying for it.
            self._live = (slot, reader, workers)
        handoff = not in_process and _handoff.enabled()
        arena = None
        try:
            for arr in reader:
                item = self._item(arr)
                if tag:
                    cursor = json.dumps(arr.base.full_cursor)
                    item[_POSITION] = {"slot": slot, "cursor": cursor}
                if handoff:
                    # Through a slot of this worker's shared memory, not torch's pickling
                    # of each tensor (see dquant._handoff); torch's way when none is free.
                    arena = arena or _handoff.arena_for(item)
                    item = arena.put(item) or item
                yield item
        finally:
            if not tag:
                self._sync_live(reader)
            reader.close()
        if in_process:
            self._finished()
        elif not tag:
            self._pass_ended = True

    def _open(self, slot: int, workers: int, cursor: Dict[str, Any]) -> "dquant.Reader":
        """A reader of sub-rank ``slot`` of ``workers``'s batches from ``cursor`` on."""
        share = None
        if self.share is not None:
            share = self.share if workers == 1 else f"{self.share}/w{slot}"
        plan = self._plan_for(slot, workers)
        return dquant.open(
            plan,
            offload=self.offload,
            transport=self.transport,
            agent=self._agent_for(plan, workers),
            cursor=cursor,
            share=share,
            share_group=self.share_group,
        )

    def _agent_for(self, plan: dict, workers: int) -> Optional[str]:
        """The agent's address for one of ``workers`` sessions read in turn by this loop:
        with more than one, each shared-memory ring gets its share of one default ring's
        slots (``slots=``, unless the address sets it), as the loop drains them in turn and
        each is made anew every pass."""
        agent = self.agent
        if workers <= 1 or not self.offload or agent is None or "slots=" in str(agent):
            return agent
        slots = dquant._dquant.ring_slots(json.dumps(plan), workers)
        return dquant._with_option(str(agent), "slots", slots)

    def _sync_live(self, reader=None) -> None:
        """Records where the in-process reader, or a running pass's sub-ranks, stand (the
        loop received all they yielded)."""
        if reader is None and self._ring_pass is not None:
            self._ring_pass.sync()
        live = self._live
        if live is None or (reader is not None and live[1] is not reader):
            return
        slot, r, workers = live
        if not r.closed:
            self._delivered(slot, r.cursor(), workers)
        if reader is not None:
            self._live = None

    def _item(self, arr) -> Dict[str, torch.Tensor]:
        batch = arr.base
        inputs, labels = batch.inputs_and_labels()  # views of the batch's memory
        item = {self._inputs: torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
        if self._masks:
            mask, pos = batch.masks(self._masks)
            if mask is not None:
                item["loss_mask"] = torch.from_numpy(mask)
            if pos is not None:
                item["position_ids"] = torch.from_numpy(pos)
        if self._cu_seqlens:
            cu, longest = batch.cu_seqlens()
            item["cu_seqlens"] = torch.from_numpy(cu)
            item["max_seqlen"] = torch.tensor(longest, dtype=torch.int32)
        if self._provenance:
            item["provenance"] = torch.from_numpy(batch.provenance)
        return item

    # -- state ---------------------------------------------------------------------------

    def _fresh_state(self, workers: int) -> Dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "plan": json.dumps(self.plan, sort_keys=True),
            "rank": self.rank,
            "world_size": self.world_size,
            "num_workers": workers,
            "next_slot": 0,
            "cursors": [dict(self._start) for _ in range(workers)],
            "start": dict(self._start),
            "finished": False,
        }

    def _state_for(self, workers: int) -> Dict[str, Any]:
        """The state to start an iteration with ``workers`` sub-ranks."""
        s = self._state
        if s is None or s["finished"]:
            return self._fresh_state(workers)
        if s["num_workers"] != workers:
            if self.world_size != 1:
                raise ValueError(
                    f"TokenDataset: the data position was saved with {s['num_workers']} "
                    f"DataLoader worker(s) per rank, this loader has {_loader_workers(workers)}: "
                    "to resume on another number of workers, load every rank's state_dict() "
                    "(a list, or TokenDataset.merge_states of it)"
                )
            # One rank holds every sub-rank: its cursors merge into one any loader starts from.
            self._start = _merged_cursor([s])
            self._state = None
            return self._fresh_state(workers)
        return s

    def _delivered(self, slot: int, cursor: Dict[str, Any], workers: int) -> None:
        if self._state is None or self._state["finished"]:
            self._state = self._fresh_state(workers)
        self._state["cursors"][slot] = cursor
        self._state["next_slot"] = (slot + 1) % workers

    def _finished(self) -> None:
        """The loop received the whole stream: the next iteration starts over."""
        if self._state is not None:
            self._state["finished"] = True
        self._start = dict(_START)

    def state_dict(self) -> Dict[str, Any]:
        """Where the training loop is in the stream: pass it to :meth:`load_state_dict` to
        resume exactly after the last batch it received. Plain data (JSON-serializable).

        Each sub-rank's cursor carries the blend's per-source counts when the plan runs in this
        process, so a resume does not replay the blend from the first sample.

        Raises ``RuntimeError`` in the loop's process while workers of a loader that does not
        track positions (torch's own ``DataLoader`` with ``num_workers > 0``, or torchdata's
        ``StatefulDataLoader``, whose ``state_dict()`` holds the position instead) read the
        dataset: this process never sees where their batches stand. In such a worker it is
        that worker's own position, as StatefulDataLoader takes it."""
        if self._read_by_workers[0] and torch.utils.data.get_worker_info() is None:
            raise RuntimeError(_UNKNOWN_POSITION)
        self._sync_live()
        s = self._state if self._state is not None else self._fresh_state(0)
        return json.loads(json.dumps(s))

    def load_state_dict(self, state: Any) -> str:
        """Resumes from :meth:`state_dict`'s result: the next iteration yields exactly the
        rest of the stream.

        On the same ranks and DataLoader workers, pass this rank's state: the stream goes on
        exactly as the uninterrupted run's. On another topology (more or fewer ranks or
        workers), pass the list of every rank's state (or :meth:`merge_states` of it): every
        sample the old run's loops did not receive is delivered once, to some rank, and none
        they received comes again. A state saved with one rank is enough on its own.

        The plan may have changed since, in its ``stages``/``interpolate`` after the saved
        position and in the run's length (``samples``/``epochs``): the stream goes on from
        the saved cursors' exact per-source counts, and every sample before them stays as it
        was. Any other change is refused, saying which field. Returns what was accepted (also
        in ``self.resume_note``, and logged on the ``dquant`` logger)."""
        if isinstance(state, (list, tuple)):
            state = TokenDataset.merge_states(state)
        s = _checked_state(state)
        if "slot" in s and torch.utils.data.get_worker_info() is None:
            raise ValueError(_worker_state_refused(s))
        self._live = self._ring_pass = None
        self._pass_ended = False
        if torch.utils.data.get_worker_info() is None:
            self._read_by_workers[0] = 0  # this process knows the position again: this one
        plan = json.dumps(self.plan, sort_keys=True)
        if s["plan"] == plan:
            self.resume_note = "the plan is unchanged"
        else:
            cursors = [s["merged"]] if "merged" in s else s["cursors"] or [s["start"]]
            try:
                self.resume_note = dquant._dquant.check_plan_change(
                    s["plan"], plan, [json.dumps(c) for c in cursors], self.agent or ""
                )
            except ValueError as e:
                raise ValueError(
                    f"TokenDataset.load_state_dict: the state was saved for a different plan, "
                    f"and it cannot continue under this one: {e}"
                ) from None
            _log.info("TokenDataset.load_state_dict: %s", self.resume_note)
            s["plan"] = plan
        if "merged" in s:
            self._start, self._state = dict(s["merged"]), None
            return self.resume_note
        if (s["rank"], s["world_size"]) != (self.rank, self.world_size):
            if s["world_size"] != 1:
                raise ValueError(
                    f"TokenDataset.load_state_dict: the state is rank {s['rank']} of "
                    f"{s['world_size']}, this dataset is rank {self.rank} of {self.world_size}: "
                    "to resume on another number of ranks, load every rank's state_dict() (a "
                    "list, or TokenDataset.merge_states of it)"
                )
            self._start, self._state = _merged_cursor([s]), None
            return self.resume_note
        self._start = dict(s["start"])
        self._state = None if s["num_workers"] == 0 else s
        return self.resume_note

    @staticmethod
    def merge_states(states: Any) -> Dict[str, Any]:
        """One state from the states of every rank of a run (``states[r]`` or any order: each
        names its rank), which a dataset of any rank and world size loads with
        :meth:`load_state_dict`: the ranks' DataLoader workers stood at different positions,
        and the merged state lists what each delivered past the slowest, so nothing is lost
        or repeated on the new topology."""
        checked = [_checked_state(s) for s in states]
        if not checked:
            raise ValueError("TokenDataset.merge_states: no states")
        for s in checked:
            if "slot" in s:
                raise ValueError(_worker_state_refused(s))
        plan = checked[0]["plan"]
        if any(s["plan"] != plan for s in checked):
            raise ValueError("TokenDataset.merge_states: the states were saved for different plans")
        return {"version": _STATE_VERSION, "plan": plan, "merged": _merged_cursor(checked)}


_START: Dict[str, Any] = {"epoch": 0, "consumed_samples": 0}

_UNKNOWN_POSITION = (
    "TokenDataset.state_dict: DataLoader worker processes read this dataset and the loop's "
    "process never sees their batches' positions, so a state from here would rewind to where "
    "the pass began. Checkpoint the position where it is known: dquant.torch.DataLoader(ds, "
    "num_workers=N) keeps ds.state_dict() exact; with torchdata's StatefulDataLoader save "
    "loader.state_dict() (it holds every worker's TokenDataset state) and resume with "
    "loader.load_state_dict(); or read the dataset with num_workers=0"
)


def _worker_state_refused(s: Dict[str, Any]) -> str:
    return (
        f"TokenDataset.load_state_dict: this is the state of one DataLoader worker (sub-rank "
        f"{s['slot']} of {s['num_workers']}), as torchdata's StatefulDataLoader keeps it inside "
        "its own state_dict(): it knows that worker's position only. Resume it with "
        "StatefulDataLoader.load_state_dict(loader_state)"
    )


def _loader_workers(n: int) -> int:
    """The DataLoader's ``num_workers`` for ``n`` sub-ranks per rank (one stands for 0)."""
    return n if n > 1 else 0


def _checked_state(state: Any) -> Dict[str, Any]:
    """A TokenDataset state (this version's, an earlier one's, or a merged one), checked and
    copied; version 1 cursors (``[epoch, consumed]``) become cursor dicts."""
    try:
        version = state["version"]
        if version not in (1, _STATE_VERSION):
            raise ValueError(
                f"TokenDataset.load_state_dict: state version {version}, expected {_STATE_VERSION}"
            )
        if "merged" in state:
            return {"version": version, "plan": state["plan"], "merged": dict(state["merged"])}
        keys = ("plan", "rank", "world_size", "num_workers", "next_slot", "cursors", "finished")
        s = {k: state[k] for k in keys}
        s["cursors"] = [
            {"epoch": c[0], "consumed_samples": c[1]} if isinstance(c, (list, tuple)) else dict(c)
            for c in s["cursors"]
        ]
        s["start"] = dict(state.get("start", _START))
        if state.get("slot") is not None:
            # One worker's state, as StatefulDataLoader keeps it (see TokenDataset._worker_pass).
            s["slot"] = int(state["slot"])
        # What state_dict() gives after this resume is a current state, whatever was loaded.
        s["version"] = _STATE_VERSION
    except (KeyError, TypeError):
        raise ValueError(f"TokenDataset.load_state_dict: not a TokenDataset state: {state!r}") from None
    n = s["num_workers"]
    if len(s["cursors"]) != n or not 0 <= s["next_slot"] < max(n, 1) or not 0 <= s.get("slot", 0) < max(n, 1):
        raise ValueError("TokenDataset.load_state_dict: inconsistent state (cursors, next_slot)")
    return json.loads(json.dumps(s))


def _merged_cursor(states: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The cursor every sub-rank of ``states`` (the checked states of all ranks of a run)
    merges into: sub-rank ``rank * workers + worker`` is worker ``worker`` of rank ``rank``."""
    world = states[0]["world_size"]
    by_rank = {s["rank"]: s for s in states}
    if sorted(by_rank) != list(range(world)) or len(states) != world:
        raise ValueError(
            f"TokenDataset.merge_states: need the states of ranks 0..{world - 1} (world size "
            f"{world}), got ranks {sorted(s['rank'] for s in states)}"
        )
    if all(s["finished"] for s in states):
        return dict(_START)
    workers = max(s["num_workers"] for s in states)
    if workers == 0:
        return dict(states[0]["start"])
    cursors: List[Dict[str, Any]] = []
    for r in range(world):
        s = by_rank[r]
        if s["num_workers"] == workers:
            cursors.extend(s["cursors"])
        elif s["num_workers"] == 0:
            # This rank's loop received nothing yet: its workers stand at its start.
            cursors.extend(dict(s["start"]) for _ in range(workers))
        else:
            raise ValueError(
                f"TokenDataset.merge_states: rank {r} ran {s['num_workers']} DataLoader "
                f"worker(s), others {workers}"
            )
    return dquant.merge_cursors(cursors)


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` for a :class:`TokenDataset` that keeps the dataset's
    ``state_dict`` exact under worker prefetch: it records each batch's position as the batch
    reaches the loop, and removes the tag. ``batch_size`` is the plan's (leave it ``None``);
    every other argument is torch's.

    Workers. With ``num_workers > 0`` each of the ``num_workers`` sub-ranks of this rank is
    read the way torch's workers would split it, and the stream is the one torch's workers
    give, batch for batch, with no per-batch work of torch's queues:

    * for a plan that runs in-process, the workers are dquant's own processes (see
      :mod:`dquant._ring_workers`), each making its batches in Rust straight into a
      shared-memory ring the loop reads in place;
    * for a plan an agent runs, the agent is the worker: each sub-rank is a session of the
      agent's, read in this process (see :mod:`dquant._sessions`), and no process is started.

    They take ``timeout``, ``pin_memory`` and ``persistent_workers`` as torch's do (an agent's
    sessions are opened each pass whatever ``persistent_workers`` says).

    Device. With ``device`` (``"cuda"``, ``"cuda:1"``, a ``torch.device``), every batch
    reaches the loop in that device's memory, ready on the stream current when the loop takes
    it: the loader copies each batch's memory once into a pinned buffer it reuses, then to
    the device on the current stream (see :mod:`dquant._to_device`), in place of
    ``pin_memory`` and the loop's ``.to(device)``. Tensors that share memory (``input_ids``
    and ``labels``) share it on the device too. On a trainer host this is the cheaper hop:
    ``bench/gpu`` measured it. Leave ``pin_memory`` off with it.
    torch's own workers run instead with ``torch_workers=True``, or when the loader needs
    what only they do: a ``worker_init_fn``, a ``collate_fn``, or a ``multiprocessing_context``
    other than fork."""

    def __init__(
        self,
        dataset: TokenDataset,
        *,
        torch_workers: bool = False,
        device: Optional[Union[str, torch.device]] = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, TokenDataset):
            raise TypeError(f"dquant.torch.DataLoader needs a TokenDataset, got {type(dataset).__name__}")
        if device is not None and kwargs.get("pin_memory"):
            raise ValueError(
                "dquant.torch.DataLoader: device= stages batches in pinned buffers of its own; "
                "leave pin_memory False"
            )
        if kwargs.get("batch_size") is not None:
            raise ValueError(
                "dquant.torch.DataLoader: batches come from the plan (its batch_size); leave "
                "the DataLoader's batch_size as None"
            )
        kwargs["batch_size"] = None
        # Before torch's __init__, which asks check_worker_number_rationality.
        self.torch_workers = torch_workers
        super().__init__(dataset, **kwargs)
        # The running pass's dquant workers (None: none running).
        self.workers: Optional[Union[_workers.Workers, _sessions.Sessions]] = None
        # Ring workers kept between passes (persistent_workers=True).
        self._rings: Optional[_ring_workers.RingWorkers] = None
        # Moves each batch to `device` before the loop gets it (None: batches stay in host
        # memory).
        self._to_device = _to_device.ToDevice(device) if device is not None else None

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        ds: TokenDataset = self.dataset
        if self.num_workers == 0 and self.collate_fn is _default_convert and not self.pin_memory:
            # In this process torch's fetch path adds ~8 us a batch (a profiler range, a
            # sampler step, and default_convert rebuilding a dict of tensors that need no
            # converting): take the dataset's items as they are. (Pinning costs far more than
            # that, so with pin_memory torch's own path runs.)
            if self._to_device is None:
                yield from ds
            else:
                yield from map(self._to_device, ds)
            return
        workers = max(self.num_workers, 1)
        own = self.num_workers > 0 and not self.torch_workers
        if own:
            why = _workers.fits(self, _default_convert)
            if why is not None:
                _log.debug("dquant.torch.DataLoader: torch's workers run, for %s", why)
                own = False
        # The state this pass starts from, in this process as in the workers: a state saved
        # with another number of workers becomes the merged cursor they all start at.
        ds._state_for(workers)
        # While this pass runs, workers made for it (torch's, started by super().__iter__(),
        # or dquant's socket workers) get a copy that tags each batch with its position, and
        # this process learns every position: the dataset's state_dict() is exact here. A
        # copy torch's own DataLoader makes later, of the same dataset, is untracked again.
        ds._tracked = True
        ds._read_by_workers[0] = 0
        try:
            it = self._own_workers(workers) if own else super().__iter__()
            for batch in it:
                pos = batch.pop(_POSITION, None)
                if pos is not None:
                    ds._delivered(int(pos["slot"]), json.loads(pos["cursor"]), workers)
                yield batch if self._to_device is None else self._to_device(batch)
        finally:
            ds._tracked = False
        if self.num_workers > 0:
            ds._finished()

    def check_worker_number_rationality(self) -> None:
        """torch's warning about more workers than cores, unless the workers are an agent's
        sessions: then no process starts."""
        if self.dataset.offload and not self.torch_workers and _workers.fits(self, _default_convert) is None:
            return
        super().check_worker_number_rationality()

    def _own_workers(self, workers: int) -> Iterator[Dict[str, torch.Tensor]]:
        # torch.accelerator is torch 2.6's; before it, pinning was for CUDA.
        accelerator = getattr(torch, "accelerator", torch.cuda)
        pin = self.pin_memory and accelerator.is_available()
        if self.pin_memory and not pin:
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, then device "
                "pinned memory won't be used.",
                stacklevel=3,
            )
        ds: TokenDataset = self.dataset
        if not ds.offload and not _ring_workers.enabled():
            pool = self.workers = _workers.Workers(ds, workers, self.timeout)
            try:
                for batch in pool:
                    yield _pin_memory(batch) if pin else batch
            finally:
                pool.close()
                if self.workers is pool:
                    self.workers = None
            return
        rings = self._rings
        if ds.offload:
            # The agent's sessions are the workers: nothing to keep between passes.
            rings = _sessions.Sessions(ds, workers, self.timeout)
        elif rings is None or not rings.alive() or rings.n != workers:
            self._shutdown_rings()
            rings = _ring_workers.RingWorkers(ds, workers, self.timeout)
        self.workers = rings
        ok = False
        try:
            for batch in rings.run():
                yield _pin_memory(batch) if pin else batch
            ok = True
        except GeneratorExit:  # the loop stopped early (a break, the iterator dropped)
            ok = True
            raise
        finally:
            self.workers = None
            if ok and self.persistent_workers and not ds.offload and rings.alive():
                self._rings = rings  # they wait for the next pass
            else:
                rings.close()
                self._rings = None

    def _shutdown_rings(self) -> None:
        rings, self._rings = self._rings, None
        if rings is not None:
            rings.close()

    def worker_pids(self) -> List[int]:
        """The process ids of the workers running a pass, or kept for the next
        (``persistent_workers``)."""
        pool = self.workers or self._rings
        return pool.pids() if pool is not None else []

    def __del__(self) -> None:
        # Persistent workers go with their loader, as torch's go with its iterator.
        if getattr(self, "_rings", None) is not None:
            self._shutdown_rings()
