"""TokenDataset under torchdata's StatefulDataLoader, the ecosystem's resumable loader: the
loader keeps each worker's TokenDataset state alongside the batches it yields, so a checkpoint
taken while workers have batches prefetched past the last one consumed resumes with nothing
lost and nothing repeated. And under torch's own DataLoader with workers, where the loop's
process never sees the batches' positions, TokenDataset.state_dict() raises rather than
return a state that would rewind (issue 70).

Each sample is identified by where its tokens come from (its provenance rows: source,
document, offset, length; the plans here stay within one epoch of each source, so no two
samples share them), numbered by its place in one whole pass read in this process, and by its
tokens: a resumed pass is checked against the whole pass by both."""

from __future__ import annotations

import io
import re
import time
from collections import Counter

import numpy as np
import pytest
import torch
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

from conftest import on_agent, plan
from dquant.torch import DataLoader, TokenDataset

# torchdata 0.11 calls torch.set_vital, which torch 2.15 deprecates, in every loader's __init__.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

UNKNOWN = (
    "TokenDataset.state_dict: DataLoader worker processes read this dataset and the loop's "
    "process never sees their batches' positions, so a state from here would rewind to where "
    "the pass began. Checkpoint the position where it is known: dquant.torch.DataLoader(ds, "
    "num_workers=N) keeps ds.state_dict() exact; with torchdata's StatefulDataLoader save "
    "loader.state_dict() (it holds every worker's TokenDataset state) and resume with "
    "loader.load_state_dict(); or read the dataset with num_workers=0"
)


def blend(data, **fields) -> dict:
    """A blended plan whose batches say where each sample's tokens come from (provenance)."""
    fields.setdefault("batch_size", 3)
    return plan(data, ("r50k_int32", 0.6), ("shifted.i32", 0.4), seed=5, provenance=True, **fields)


def places(batches) -> list[bytes]:
    """Each sample's provenance rows but the first column (its index in its batch): where its
    tokens come from."""
    out = []
    for b in batches:
        rows = b["provenance"].numpy()
        out.extend(rows[rows[:, 0] == i, 1:].tobytes() for i in range(len(b["input_ids"])))
    return out


_NUMBERS: dict = {}


def numbering(p: dict) -> dict:
    """Each sample's place -> its index in one whole pass of ``p`` read in this process (the
    plan's global order); the places are checked to be distinct."""
    key = repr(p)
    if key not in _NUMBERS:
        whole = places(TokenDataset(p))
        number = {place: i for i, place in enumerate(whole)}
        assert len(number) == len(whole), "a plan here must not repeat a sample"
        _NUMBERS[key] = number
    return _NUMBERS[key]


def ids(batches, p) -> list[int]:
    """The global index of every sample of ``batches`` (of plan ``p``), in order."""
    number = numbering(p)
    return [number[place] for place in places(batches)]


def tokens(batches) -> list[bytes]:
    """Each sample's seq_len + 1 tokens, in order."""
    return [
        r.tobytes()
        for b in batches
        for r in torch.cat([b["input_ids"], b["labels"][:, -1:]], dim=1).numpy()
    ]


def whole_pass(p: dict, **ds_kw) -> tuple[list[int], list[bytes]]:
    """One pass of ``p``'s stream, read in this process: (sample indices, tokens)."""
    batches = list(TokenDataset(p, **ds_kw))
    return ids(batches, p), tokens(batches)


def loader(ds, workers: int, **kw) -> StatefulDataLoader:
    if workers:
        kw.setdefault("prefetch_factor", 4)
    return StatefulDataLoader(ds, batch_size=None, num_workers=workers, **kw)


def checkpointed(sd: dict) -> dict:
    """``sd`` through torch.save and torch.load (weights only), as a checkpoint takes it."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def wait_for_prefetch(it, at_least: int) -> int:
    """Waits (up to 20 s) until the workers have made at least ``at_least`` batches the loop
    has not taken, and returns how many: torch's loader holds them in its result queue."""
    deadline = time.monotonic() + 20
    while True:
        ready = it._data_queue.qsize()
        if ready >= at_least or time.monotonic() > deadline:
            return ready
        time.sleep(0.01)


def head_then_resume(p, workers: int, stop: int, ds_kw=None, **kw):
    """Reads ``stop`` batches of a StatefulDataLoader over ``p``, checkpoints it (with
    workers, once they have made batches past the last one taken), drops it, workers and all,
    and finishes the pass with a new loader over a new dataset: (batches before, batches
    after, batches prefetched at the checkpoint)."""
    ds_kw = ds_kw or {}
    first = loader(TokenDataset(p, **ds_kw), workers, **kw)
    it = iter(first)
    head = [next(it) for _ in range(stop)]
    prefetched = wait_for_prefetch(it, 2) if workers else 0
    sd = checkpointed(first.state_dict())
    del it, first
    second = loader(TokenDataset(p, **ds_kw), workers, **kw)
    second.load_state_dict(sd)
    return head, list(second), prefetched


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("where", ["after one batch", "halfway", "at the last batch"])
def test_a_checkpoint_mid_prefetch_resumes_with_nothing_lost_or_repeated(data, workers, where):
    # 301 samples in batches of 3 per sub-rank: 101 or 102 batches, the workers' last ones
    # short, and with 2 workers one worker has a batch more (it ended at the last checkpoint).
    p = blend(data, samples=301)
    full = list(loader(TokenDataset(p), workers))
    n = len(full)
    stop = {"after one batch": 1, "halfway": n // 2, "at the last batch": n - 1}[where]
    head, rest, prefetched = head_then_resume(p, workers, stop)
    assert len(head) + len(rest) == n
    if workers and stop < n - 1:
        # The checkpoint was taken with batches made past the last one the loop took.
        assert prefetched >= 2
    want_ids, want_tokens = whole_pass(p)
    got = ids(head, p) + ids(rest, p)
    # Every global sample exactly once, with the tokens the plan gives it ...
    assert sorted(got) == list(range(301)) == sorted(want_ids)
    assert Counter(tokens(head) + tokens(rest)) == Counter(want_tokens)
    # ... in the order of the uninterrupted loader's batches.
    assert got == ids(full, p)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_two_ranks_each_checkpointed_mid_prefetch_cover_the_plan_once(data, workers):
    p = blend(data, samples=240, batch_size=4)
    got_ids, got_tokens = [], []
    for rank, stop in ((0, 7), (1, 12)):
        head, rest, prefetched = head_then_resume(
            p, workers, stop, ds_kw={"rank": rank, "world_size": 2}
        )
        if workers:
            assert prefetched >= 2
        # The rank's sub-ranks: worker w of rank r of 2 is sub-rank r * W + w of 2 * W, and
        # global sample i goes to sub-rank i % (2 * W).
        w = max(workers, 1)
        mine = [i for i in range(240) if i % (2 * w) // w == rank]
        assert sorted(ids(head, p) + ids(rest, p)) == mine
        if not workers:
            assert ids(head, p) + ids(rest, p) == whole_pass(p, rank=rank, world_size=2)[0]
        got_ids += ids(head, p) + ids(rest, p)
        got_tokens += tokens(head) + tokens(rest)
    all_ids, all_tokens = whole_pass(p)
    assert sorted(got_ids) == list(range(240)) == sorted(all_ids)
    assert Counter(got_tokens) == Counter(all_tokens)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_an_agent_s_sessions_in_workers_resume_mid_prefetch(data, agent, transport):
    """Each worker reads its sub-rank as a session of an agent, which runs ahead of the worker
    as well: the worker's state is still the position after the batch it handed over."""
    p = blend(data, samples=150)
    remote = on_agent(p, data)
    target = agent.socket if transport == "shm" else agent.uri
    ds_kw = {"agent": target, "transport": transport}
    head, rest, prefetched = head_then_resume(remote, 2, 11, ds_kw=ds_kw)
    assert prefetched >= 2
    full = list(loader(TokenDataset(p), 2))
    assert ids(head, p) + ids(rest, p) == ids(full, p)
    assert sorted(ids(full, p)) == list(range(150))


def test_a_snapshot_every_few_steps_replays_to_the_exact_position(data):
    """With ``snapshot_every_n_steps=5`` the loader's state is the last snapshot plus the
    steps since, which it fast-forwards on resume: the dataset's states must replay exactly."""
    p = blend(data, samples=150)
    head, rest, prefetched = head_then_resume(p, 2, 13, snapshot_every_n_steps=5)
    assert prefetched >= 2
    full = list(loader(TokenDataset(p), 2))
    assert ids(head, p) + ids(rest, p) == ids(full, p)
    assert sorted(ids(full, p)) == list(range(150))


def test_persistent_workers_start_each_epoch_over_and_resume_within_one(data):
    p = blend(data, samples=90)
    ds = TokenDataset(p)
    dl = loader(ds, 2, persistent_workers=True)
    first, second = ids(list(dl), p), ids(list(dl), p)
    assert first == second and sorted(first) == list(range(90))
    it = iter(dl)  # a third epoch, checkpointed mid-prefetch
    head = [next(it) for _ in range(9)]
    assert wait_for_prefetch(it, 2) >= 2
    sd = checkpointed(dl.state_dict())
    del it, dl
    again = loader(TokenDataset(p), 2, persistent_workers=True)
    again.load_state_dict(sd)
    assert ids(head, p) + ids(list(again), p) == first


def test_the_old_rewind_6000_samples_stopped_after_3600(data):
    """Issue 70's case: a 6,000-sample plan stopped after 3,600 delivered samples. Through
    torch's DataLoader with workers a state from the loop's process would have replayed all
    6,000: it raises instead. Through StatefulDataLoader the resume delivers exactly the other
    2,400."""
    p = blend(data, samples=6000, batch_size=8, seq_len=31)  # one epoch of each source
    ds = TokenDataset(p)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=4))
    seen = [next(it) for _ in range(3600 // 8)]
    assert len(ids(seen, p)) == 3600
    with pytest.raises(RuntimeError, match=f"^{re.escape(UNKNOWN)}$"):
        ds.state_dict()
    del it

    head, rest, prefetched = head_then_resume(p, 2, 3600 // 8)
    assert prefetched >= 2
    assert len(ids(head, p)) == 3600 and len(ids(rest, p)) == 2400
    assert sorted(ids(head, p) + ids(rest, p)) == list(range(6000))
    assert not set(ids(head, p)) & set(ids(rest, p))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_s_dataloader_with_workers_makes_state_dict_raise(data, context):
    p = blend(data, samples=120)
    ds = TokenDataset(p)
    assert ds.state_dict()["cursors"] == []  # nothing read yet: the start, known
    dl = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=context
    )
    it = iter(dl)
    next(it)
    with pytest.raises(RuntimeError, match=f"^{re.escape(UNKNOWN)}$"):
        ds.state_dict()
    rest = list(it)
    # The pass ended, but this process still never saw where: it raises still.
    with pytest.raises(RuntimeError, match=f"^{re.escape(UNKNOWN)}$"):
        ds.state_dict()
    assert len(rest) == 39 and "dquant_position" not in rest[0]


def test_state_dict_raises_under_statefuldataloader_s_workers_in_the_loop_s_process(data):
    """The position is in the loader's state_dict(), not the loop's copy of the dataset; one
    worker's state, loaded outside its worker, is refused."""
    p = blend(data, samples=120)
    ds = TokenDataset(p)
    dl = loader(ds, 2)
    it = iter(dl)
    next(it)
    with pytest.raises(RuntimeError, match=f"^{re.escape(UNKNOWN)}$"):
        ds.state_dict()
    worker0 = dl.state_dict()["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert worker0["slot"] == 0 and worker0["num_workers"] == 2
    refused = (
        "TokenDataset.load_state_dict: this is the state of one DataLoader worker (sub-rank 0 "
        "of 2), as torchdata's StatefulDataLoader keeps it inside its own state_dict(): it "
        "knows that worker's position only. Resume it with "
        "StatefulDataLoader.load_state_dict(loader_state)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(refused)}$"):
        TokenDataset(p).load_state_dict(worker0)
    with pytest.raises(ValueError, match=f"^{re.escape(refused)}$"):
        TokenDataset.merge_states([worker0])


def test_the_position_is_known_again_after_a_load_an_in_process_pass_or_dquant_s_loader(data):
    """The raise is only for a position this process cannot know: a load, a pass in this
    process, or a pass of dquant's DataLoader (which tracks it) make state_dict() exact again,
    and torch's loader on a dataset dquant's loader read gets untagged batches."""
    p = blend(data, samples=120)
    ds = TokenDataset(p)
    saved = ds.state_dict()

    def through_torch_workers():
        it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
        assert "dquant_position" not in next(it)
        with pytest.raises(RuntimeError, match=f"^{re.escape(UNKNOWN)}$"):
            ds.state_dict()

    through_torch_workers()
    ds.load_state_dict(saved)
    assert ds.state_dict() == saved

    through_torch_workers()
    head = []
    for b in torch.utils.data.DataLoader(ds, batch_size=None):  # in this process
        head.append(b)
        if len(head) == 4:
            break
    rest = TokenDataset(p)
    rest.load_state_dict(ds.state_dict())
    assert ids(head, p) + ids(list(rest), p) == whole_pass(p)[0]

    # dquant's DataLoader goes on from the 4 batches above, and tracks its workers' positions.
    through_torch_workers()
    for b in DataLoader(ds, num_workers=2, torch_workers=True):
        head.append(b)
        if len(head) == 9:
            break
    rest = TokenDataset(p)
    rest.load_state_dict(ds.state_dict())
    assert sorted(ids(head, p) + ids(list(DataLoader(rest, num_workers=2)), p)) == list(range(120))
    through_torch_workers()  # and torch's workers, after it, get untagged batches
