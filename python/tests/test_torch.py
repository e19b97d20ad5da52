"""dquant.torch: sharding over ranks and DataLoader workers, exact resumption under
prefetch, exact blend weights, int64 and raw items."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dquant
from conftest import SHIFT, plan
from dquant.torch import DataLoader, TokenDataset


def samples_of(batches) -> np.ndarray:
    """Whole samples (seq_len + 1 tokens) back from input_ids/labels items."""
    return np.concatenate(
        [torch.cat([b["input_ids"], b["labels"][:, -1:]], dim=1).numpy() for b in batches]
    )


def rows(a: np.ndarray) -> list[bytes]:
    return sorted(r.tobytes() for r in a.astype(np.int64))


def test_two_ranks_of_three_workers_get_every_sample_exactly_once(data, tmp_path):
    """torch.distributed (gloo, 2 processes) x 3 DataLoader workers each: the union of what
    the 6 (rank, worker) pairs receive is the plan's stream, as a multiset, with nothing
    twice."""
    p = plan(data, ("r50k_int32", 0.7), ("shifted.i32", 0.3), epochs=2, batch_size=3)
    with dquant.open(p, offload=False) as r:
        want = np.concatenate(list(r))
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "dist_rank.py"), str(rank), "2",
             str(store), json.dumps(p), str(tmp_path / f"rank{rank}.npy")],
        )
        for rank in range(2)
    ]
    for proc in procs:
        assert proc.wait(300) == 0
    got = [np.load(tmp_path / f"rank{rank}.npy") for rank in range(2)]
    # Ranks split the samples evenly (to within one batch per worker).
    assert abs(len(got[0]) - len(got[1])) <= 3 * 3
    assert len(got[0]) + len(got[1]) == len(want)
    assert rows(np.concatenate(got)) == rows(want)


def test_rank_and_world_size_come_from_arguments_or_the_plan(data):
    p = plan(data)
    assert (TokenDataset(p).rank, TokenDataset(p).world_size) == (0, 1)
    assert (TokenDataset(dict(p, rank=1, world=3)).rank, TokenDataset(dict(p, rank=1, world=3)).world_size) == (1, 3)
    ds = TokenDataset(p, rank=2, world_size=4)
    assert (ds.rank, ds.world_size) == (2, 4)
    with pytest.raises(ValueError, match="^rank 4 is not below world_size 4$"):
        TokenDataset(p, rank=4, world_size=4)
    with pytest.raises(ValueError, match="^pass both rank and world_size, or neither$"):
        TokenDataset(p, rank=1)


@pytest.mark.parametrize("workers", [0, 3])
def test_a_resumed_run_yields_exactly_the_rest_despite_prefetch(data, workers):
    p = plan(data, ("r50k_int32", 0.6), ("shifted.i32", 0.4), epochs=2, batch_size=2, seed=3)
    kw = {"num_workers": workers}
    if workers:
        kw["prefetch_factor"] = 4  # workers run up to 12 batches ahead of the loop
    full = samples_of(DataLoader(TokenDataset(p), **kw))
    ds = TokenDataset(p)
    head = []
    for i, b in enumerate(DataLoader(ds, **kw)):
        head.append(b)
        if i == 10:
            break
    state = json.loads(json.dumps(ds.state_dict()))  # plain data, as in a checkpoint
    ds2 = TokenDataset(p)
    ds2.load_state_dict(state)
    for i, b in enumerate(DataLoader(ds2, **kw)):
        head.append(b)
        if i == 6:
            break
    # A checkpoint of the resumed run resumes too (its state had lost its version once).
    state = json.loads(json.dumps(ds2.state_dict()))
    ds3 = TokenDataset(p)
    ds3.load_state_dict(state)
    rest = list(DataLoader(ds3, **kw))
    # The same samples in the same order as the uninterrupted run.
    got = np.concatenate([samples_of(head), samples_of(rest)])
    np.testing.assert_array_equal(got, full)
    # After the whole stream, the next pass starts over.
    again = samples_of(DataLoader(ds3, **kw))
    np.testing.assert_array_equal(again, full)


def test_plain_dataloader_without_workers_tracks_the_position(data):
    p = plan(data, epochs=1, batch_size=3)
    full = samples_of(torch.utils.data.DataLoader(TokenDataset(p), batch_size=None))
    ds = TokenDataset(p)
    head = []
    for b in torch.utils.data.DataLoader(ds, batch_size=None):
        head.append(b)
        if len(head) == 5:
            break
    ds2 = TokenDataset(p)
    ds2.load_state_dict(ds.state_dict())
    rest = list(torch.utils.data.DataLoader(ds2, batch_size=None))
    np.testing.assert_array_equal(np.concatenate([samples_of(head), samples_of(rest)]), full)


def test_state_dict_mismatches_are_refused(data):
    p = plan(data, batch_size=3)
    ds = TokenDataset(p)
    it = iter(DataLoader(ds, num_workers=2))
    next(it)
    state = ds.state_dict()
    del it
    with pytest.raises(
        ValueError,
        match="^TokenDataset.load_state_dict: the state was saved for a different plan, and it "
        "cannot continue under this one: cursor: the plan's seed differs from the saved plan's: "
        "only stages, interpolate, samples and epochs may change while a run resumes$",
    ):
        TokenDataset(dict(p, seed=9)).load_state_dict(state)
    with pytest.raises(ValueError, match="^TokenDataset.load_state_dict: not a TokenDataset state"):
        TokenDataset(p).load_state_dict({"cursor": 3})
    # One rank of several does not know where the others stood: all their states are needed.
    ds2 = TokenDataset(p, rank=0, world_size=2)
    it2 = iter(DataLoader(ds2, num_workers=2))
    next(it2)
    state2 = ds2.state_dict()
    del it2
    with pytest.raises(
        ValueError,
        match="^TokenDataset.load_state_dict: the state is rank 0 of 2, this dataset is rank 1 "
        "of 3: to resume on another number of ranks, load every rank's state_dict",
    ):
        TokenDataset(p, rank=1, world_size=3).load_state_dict(state2)
    ds3 = TokenDataset(p, rank=0, world_size=2)
    ds3.load_state_dict(state2)
    with pytest.raises(ValueError, match="saved with 2 DataLoader worker.*this loader has 0"):
        next(iter(DataLoader(ds3, num_workers=0)))
    with pytest.raises(ValueError, match=r"^TokenDataset.merge_states: need the states of ranks 0..1 \(world size 2\), got ranks \[0\]$"):
        TokenDataset.merge_states([state2])
    with pytest.raises(ValueError, match="leave the DataLoader's batch_size as None"):
        DataLoader(ds3, batch_size=8)


def run_ranks(p, world, workers, take, start=None):
    """Runs `world` ranks of `workers` DataLoader workers (prefetching 4 batches each), rank
    r's loop taking `take[r]` batches (all, when None); returns the samples the loops received
    and each rank's state_dict."""
    received, states = [], []
    for r in range(world):
        got = []
        ds = TokenDataset(p, rank=r, world_size=world)
        if start is not None:
            ds.load_state_dict(start)
        kw = {"num_workers": workers}
        if workers:
            kw["prefetch_factor"] = 4
        for b in DataLoader(ds, **kw):
            got.append(b)  # the loop received it: the state counts it
            if len(got) == take[r]:
                break
        received.extend(got)
        states.append(json.loads(json.dumps(ds.state_dict())))
    return received, states


@pytest.mark.parametrize("world,workers", [(3, 0), (1, 4)])
def test_elastic_resume_from_2x3_delivers_every_sample_once(data, world, workers):
    """2 ranks x 3 workers checkpoint with their workers at uneven positions; the job resumes
    on 3 ranks x 1 worker, or on 1 rank x 4 workers: what the old loops received and what the
    new ones receive is the plan's stream, as a multiset, with nothing twice."""
    p = plan(data, ("r50k_int32", 0.7), ("shifted.i32", 0.3), epochs=2, batch_size=2, seed=5)
    with dquant.open(p, offload=False) as r:
        want = np.concatenate(list(r))
    head, states = run_ranks(p, 2, 3, [7, 11])
    # Each sub-rank's cursor carries the blend's counts (the plan runs in this process).
    assert all("blend" in c for s in states for c in s["cursors"] if c["consumed_samples"])
    merged = TokenDataset.merge_states(states)
    assert merged["merged"]["delivered"], "uneven workers leave samples past the watermark"
    # Loading the list is the same as loading the merged state.
    rest, _ = run_ranks(p, world, workers, [None] * world, start=states if world == 3 else merged)
    got = np.concatenate([samples_of(head), samples_of(rest)])
    assert len(got) == len(want)
    assert rows(got) == rows(want)


def megatron_blend(weights: list[float], n: int) -> list[int]:
    """Megatron-Core's build_blending_indices, in Python: sample i comes from the source
    whose count lags furthest behind its weight."""
    w = np.array(weights, dtype=np.float64)
    w = w / w.sum()
    counts = [0] * len(w)
    out = []
    for i in range(n):
        errors = [w[d] * max(i, 1) - counts[d] for d in range(len(w))]
        d = int(np.argmax(errors))
        counts[d] += 1
        out.append(d)
    return out


def test_blend_weights_are_exact_at_every_prefix(data):
    weights = [0.7, 0.3]
    p = plan(data, ("r50k_int32", weights[0]), ("shifted.i32", weights[1]), epochs=3, seed=11)
    with dquant.open(p, offload=False) as r:
        stream = np.concatenate(list(r))
    # Through the dataset too (one rank, no workers: the global order).
    via_ds = samples_of(torch.utils.data.DataLoader(TokenDataset(p), batch_size=None))
    for samples in (stream, via_ds):
        source = (samples[:, 0] >= SHIFT).astype(int)
        assert ((samples >= SHIFT).all(axis=1) | (samples < SHIFT).all(axis=1)).all()
        assert source.tolist() == megatron_blend(weights, len(samples))
        n = np.arange(1, len(samples) + 1)
        from_b = np.cumsum(source)
        assert np.abs(from_b - weights[1] * n).max() <= 1.0


def test_items_are_int64_or_raw_views(data):
    p = plan(data, "r50k_uint16", output="u16", batch_size=2)
    b = next(iter(TokenDataset(p)))
    assert b["input_ids"].dtype == torch.int64 and b["labels"].dtype == torch.int64
    assert b["input_ids"].shape == b["labels"].shape == (2, 127)
    assert torch.equal(b["labels"][:, :-1], b["input_ids"][:, 1:])
    # int64 items are views too: the batches are made as int64.
    assert b["labels"].data_ptr() == b["input_ids"].data_ptr() + 8
    raw = next(iter(TokenDataset(p, dtype="raw")))
    assert raw["input_ids"].dtype == torch.uint16
    assert torch.equal(raw["input_ids"].to(torch.int64), b["input_ids"])
    # Raw items are views of one batch buffer: labels start one token after input_ids.
    assert raw["labels"].data_ptr() == raw["input_ids"].data_ptr() + 2
    with pytest.raises(ValueError, match=r"^dtype must be one of \('int64', 'raw'\), not 'int8'$"):
        TokenDataset(p, dtype="int8")


def test_a_bad_plan_fails_when_the_dataset_is_made(data):
    with pytest.raises(ValueError, match="missing field `seq_len`"):
        TokenDataset({"sources": [{"uri": str(data / "r50k_int32")}], "batch_size": 2})
    with pytest.raises(FileNotFoundError):
        TokenDataset(plan(data, "missing"))


def test_offloaded_dataset_equals_local(data, agent):
    from conftest import on_agent

    p = plan(data, ("r50k_int32", 0.5), ("shifted.i32", 0.5), batch_size=4)
    want = samples_of(DataLoader(TokenDataset(p), num_workers=2))
    for target in (agent.uri, agent.socket):
        got = samples_of(DataLoader(TokenDataset(on_agent(p, data), agent=target), num_workers=2))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("where", ["local", "shm"])
def test_the_training_example_resumes_exactly(data, agent, where):
    """examples/train_tiny.py: a tiny model, DataLoader workers, a checkpoint mid-run and a
    resume whose losses repeat the uninterrupted run's (it exits 1 otherwise)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "train_tiny.py"
    args = ["--steps", "8", "--seq-len", "64", "--batch-size", "4"]
    if where == "local":
        args += ["--data", str(data / "r50k_int32")]
    else:
        args += ["--data", "data/r50k_int32", "--agent", agent.socket]
    out = subprocess.run(
        [sys.executable, str(example), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed losses match the uninterrupted run's" in out.stdout


def test_a_schedule_changed_after_the_saved_position_resumes_exactly(data):
    """Megatron issue 457: a running job's mixture changes. Stages after the saved position
    may change; the stream goes on from the exact counts, and nothing before it changes."""
    stages = [{"start_sample": 1200, "weights": [0.2, 0.8]}]
    p = plan(data, ("r50k_int32", 0.7), ("shifted.i32", 0.3), batch_size=4, seed=2,
             samples=2000, stages=stages)
    ds = TokenDataset(p)
    head = []
    for b in DataLoader(ds, num_workers=2):
        head.append(b)
        if len(head) == 100:  # 400 samples
            break
    state = json.loads(json.dumps(ds.state_dict()))
    annealed = dict(p, stages=[{"start_sample": 1000, "weights": [0.1, 0.9]}], samples=2400)
    ds2 = TokenDataset(annealed)
    note = ds2.load_state_dict(state)
    assert note.startswith("accepted: the mixture changes from sample 1000 on")
    assert "the run has 2400 samples (was 2000)" in note and ds2.resume_note == note
    rest = list(DataLoader(ds2, num_workers=2))
    # The changed plan run from the start gives the same head: the rest is its tail.
    want = samples_of(DataLoader(TokenDataset(annealed), num_workers=2))
    got = np.concatenate([samples_of(head), samples_of(rest)])
    np.testing.assert_array_equal(got, want)
    # The new stage's weights hold after sample 1000 (shifted ids mark source 1).
    tail = got[1000:]
    share = (tail[:, 0] >= SHIFT).mean()
    assert abs(share - 0.9) < 0.01, share
    # A change that reaches before the saved position is refused, saying where.
    early = dict(p, stages=[{"start_sample": 300, "weights": [0.1, 0.9]}])
    with pytest.raises(ValueError, match="blends differently from sample 300 on, before the "
                       "saved position"):
        TokenDataset(early).load_state_dict(state)


def test_errors_cross_from_dataloader_workers_intact():
    """A worker's error reaches the loop only pickled: an error torch cannot pickle is lost,
    and the loader then ends the epoch early without a word."""
    import pickle

    for e in (dquant.AgentError("agent went away"), dquant.AgentShutdown("drained")):
        back = pickle.loads(pickle.dumps(e))
        assert (type(back), str(back)) == (type(e), str(e))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_an_agent_killed_under_dataloader_workers_raises_not_a_short_epoch(data, fresh_agent, transport):
    from conftest import on_agent

    p = on_agent(plan(data, "r50k_int32", epochs=50, batch_size=2), data)
    target = fresh_agent.socket if transport == "shm" else fresh_agent.uri
    ds = TokenDataset(p, agent=target, transport=transport)
    loader = iter(DataLoader(ds, num_workers=2))
    for _ in range(4):
        next(loader)
    fresh_agent.kill()
    with pytest.raises(dquant.AgentError):
        for _ in loader:
            pass
