"""dquant.torch.DataLoader's own worker processes (dquant._workers): the stream equals the
one torch's workers give, batch for batch, when the workers' sub-ranks end unevenly and after
a resume; a worker that dies or fails is an error naming it, never a short epoch; a stalled
worker times out as torch's do; a pass that ends early reaps its workers; and what only
torch's workers can do (a worker_init_fn) runs on torch's."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import signal
import time

import numpy as np
import pytest
import torch

from conftest import assert_same_batches, cloned, on_agent, plan
from dquant import _ring_workers
from dquant.torch import DataLoader, TokenDataset


def uneven(data) -> dict:
    """20 samples in batches of 3, shuffled, with boundary outputs: with 3 workers the
    sub-ranks get 7, 7 and 6 samples, so 3, 3 and 2 batches (short ones last), and the
    workers end at different turns."""
    return plan(data, ("r50k_int32", 0.7), ("shifted.i32", 0.3), samples=20, batch_size=3,
                shuffle=True, boundaries="eod", eod=50256, position_ids=True, loss_mask=True)


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_the_stream_is_torch_s_batch_for_batch(data, workers):
    p = uneven(data)
    torch_s = cloned(torch.utils.data.DataLoader(TokenDataset(p), batch_size=None,
                                                 num_workers=workers))
    dl = DataLoader(TokenDataset(p), num_workers=workers, torch_workers=True)
    assert_same_batches(cloned(dl), torch_s)
    ours = DataLoader(TokenDataset(p), num_workers=workers)
    got, ran = [], []
    for b in ours:
        ran.append(ours.workers is not None)
        got.append({k: v.clone() for k, v in b.items()})
    assert all(ran), "dquant's workers ran every batch"
    assert_same_batches(got, torch_s)
    assert ours.workers is None


def test_a_resume_mid_interleaving_goes_on_as_torch_s_would(data):
    p = uneven(data)
    full = cloned(DataLoader(TokenDataset(p), num_workers=3, torch_workers=True))
    ds = TokenDataset(p)
    head = []
    for b in DataLoader(ds, num_workers=3):
        head.append({k: v.clone() for k, v in b.items()})
        if len(head) == 4:  # the next batch is the second sub-rank's
            break
    ds2 = TokenDataset(p)
    ds2.load_state_dict(ds.state_dict())
    assert_same_batches(head + cloned(DataLoader(ds2, num_workers=3)), full)


def test_a_worker_killed_is_an_error_naming_it(data):
    p = plan(data, "r50k_int32", epochs=50, batch_size=2)
    dl = DataLoader(TokenDataset(p), num_workers=2)
    it = iter(dl)
    next(it)
    pid = dl.workers.procs[1].pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"^dquant DataLoader worker 1 \(pid {pid}\) was "
                       r"killed by signal 9 \(SIGKILL\) before the end of its batches$"):
        for _ in it:
            pass
    assert dl.workers is None


def test_a_pass_that_ends_early_reaps_its_workers(data):
    dl = DataLoader(TokenDataset(plan(data, "r50k_int32", epochs=50, batch_size=2)),
                    num_workers=3)
    it = iter(dl)
    next(it)
    procs = list(dl.workers.procs.values())
    assert all(p.is_alive() for p in procs)
    it.close()  # what a `break` and the iterator's end do
    assert dl.workers is None
    assert [p.exitcode for p in procs] == [0, 0, 0]


def test_a_stalled_worker_times_out_as_torch_s_do(data, fresh_agent):
    p = on_agent(plan(data, "r50k_int32", epochs=50, batch_size=2), data)
    dl = DataLoader(TokenDataset(p, agent=fresh_agent.uri), num_workers=1, timeout=1)
    it = iter(dl)
    next(it)
    fresh_agent.proc.send_signal(signal.SIGSTOP)
    try:
        times_out(it)
    finally:
        fresh_agent.proc.send_signal(signal.SIGCONT)


def times_out(it) -> None:
    """The rest of ``it`` (a loader with ``timeout=1`` whose batches stopped coming) ends in
    torch's timeout error, well within the test's patience."""
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds$"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 30


def test_a_worker_init_fn_runs_on_torch_s_workers(data):
    p = uneven(data)
    dl = DataLoader(TokenDataset(p), num_workers=2, worker_init_fn=_seed)
    got = []
    for b in dl:
        assert dl.workers is None
        got.append({k: v.clone() for k, v in b.items()})
    assert_same_batches(got, cloned(DataLoader(TokenDataset(p), num_workers=2)))


def _seed(worker_id: int) -> None:
    np.random.seed(worker_id)


@pytest.mark.skipif(getattr(torch, "accelerator", torch.cuda).is_available(),
                    reason="pins for real where an accelerator is present")
def test_pin_memory_without_an_accelerator_warns_as_torch_does(data):
    p = uneven(data)
    dl = DataLoader(TokenDataset(p), num_workers=2, pin_memory=True)
    with pytest.warns(UserWarning, match=r"^'pin_memory' argument is set as true but no "
                      r"accelerator is found, then device pinned memory won't be used\.$"):
        got = cloned(dl)
    assert_same_batches(got, cloned(DataLoader(TokenDataset(p), num_workers=2, torch_workers=True)))


# -- ring workers (a plan that runs in-process) ---------------------------------------------


def test_in_process_plans_run_on_ring_workers_and_agent_plans_on_the_agent_s_sessions(data, agent):
    from dquant._ring_workers import RingWorkers
    from dquant._sessions import Sessions

    p = plan(data, "r50k_int32", batch_size=2)
    kinds = []
    for ds in (TokenDataset(p), TokenDataset(on_agent(p, data), agent=agent.socket)):
        dl = DataLoader(ds, num_workers=2)
        it = iter(dl)
        next(it)
        kinds.append((type(dl.workers), len(dl.worker_pids())))
        it.close()
    # An agent's plan starts no process: its two sub-ranks are two sessions of the agent.
    assert kinds == [(RingWorkers, 2), (Sessions, 0)]


def test_torch_s_warning_of_more_workers_than_cores_is_for_processes_only(data, agent):
    import warnings

    p = plan(data, "r50k_int32", batch_size=2)
    many = (os.cpu_count() or 1) + 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an agent's sessions start no process: no warning
        DataLoader(TokenDataset(on_agent(p, data), agent=agent.socket), num_workers=many)
    with pytest.warns(UserWarning, match=f"^This DataLoader will create {many} worker processes"):
        DataLoader(TokenDataset(p), num_workers=many)


def test_an_agent_s_sessions_serve_every_pass_with_persistent_workers(data, agent):
    p = uneven(data)
    want = cloned(DataLoader(TokenDataset(p), num_workers=2))
    dl = DataLoader(TokenDataset(on_agent(p, data), agent=agent.socket), num_workers=2,
                    persistent_workers=True)
    for _ in range(2):  # each pass opens its sessions; nothing is kept between passes
        assert_same_batches(cloned(dl), want)
        assert dl.workers is None and dl.worker_pids() == []


def test_an_agent_s_sessions_share_one_default_ring_s_slots(data, agent, monkeypatch):
    """Each of N sessions read in turn gets 1/N of a default ring's slots (at least 4), unless
    the address sets its own; one session keeps the default."""
    import dquant

    opened = []
    real_open = dquant.open

    def spy(*args, **kw):
        opened.append(kw.get("agent"))
        return real_open(*args, **kw)

    monkeypatch.setattr(dquant, "open", spy)
    local = plan(data, "r50k_int32", seq_len=1023, batch_size=8)
    p = on_agent(local, data)
    # A slot: the 64-byte record header, 8 × 1,024 int64 ids (64 KiB) and the trailer,
    # page-aligned: 17 pages. The default ring (8 MiB) holds 121 such slots.
    slot = 17 * 4096
    assert dquant._dquant.ring_slots(json.dumps({**p, "output": "i64"}), 1) == -(-(8 << 20) // slot)
    for workers, address, want in [(4, agent.socket, -(-(2 << 20) // slot)),
                                   (1, agent.socket, None),
                                   (2, f"{agent.socket}?slots=6", 6)]:
        opened.clear()
        ds = TokenDataset(p, agent=address, transport="shm", dtype="int64")
        got = cloned(DataLoader(ds, num_workers=workers))
        # The pass's sessions are the last opened (the loader may open one first to learn
        # the dataset's length).
        assert len(opened) >= workers
        sessions = opened[-workers:]
        assert_same_batches(got, cloned(DataLoader(TokenDataset(local, dtype="int64"),
                                                   num_workers=workers)))
        for a in sessions:
            assert (None if "slots=" not in a else int(a.rsplit("slots=", 1)[1])) == want, a


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("workers", [1, 3])
def test_an_agent_s_sessions_give_torch_s_stream_and_resume_mid_interleaving(
        data, agent, transport, workers):
    p = uneven(data)
    full = cloned(DataLoader(TokenDataset(p), num_workers=workers, torch_workers=True))
    target = agent.socket if transport == "shm" else agent.uri

    def on_agent_ds():
        return TokenDataset(on_agent(p, data), agent=target, transport=transport)

    assert_same_batches(cloned(DataLoader(on_agent_ds(), num_workers=workers)), full)
    ds = on_agent_ds()
    head = []
    for b in DataLoader(ds, num_workers=workers):
        head.append({k: v.clone() for k, v in b.items()})
        if len(head) == 4:  # with 3 workers, the next batch is the second sub-rank's
            break
    ds2 = on_agent_ds()
    ds2.load_state_dict(ds.state_dict())
    assert_same_batches(head + cloned(DataLoader(ds2, num_workers=workers)), full)


def test_ring_workers_and_socket_workers_give_the_same_stream(data, monkeypatch):
    p = uneven(data)
    rings = cloned(DataLoader(TokenDataset(p), num_workers=3))
    monkeypatch.setenv("DQUANT_WORKER_RING", "0")
    sockets = DataLoader(TokenDataset(p), num_workers=3)
    got = []
    for b in sockets:
        assert type(sockets.workers).__name__ == "Workers"
        got.append({k: v.clone() for k, v in b.items()})
    assert_same_batches(rings, got)


def test_a_ring_worker_s_failure_is_raised_in_the_loop_as_torch_raises_it(data, tmp_path):
    # The source shrinks under the worker after its first batches: the worker's read fails,
    # and the loop raises the worker's exception (its type, its message, and where it was
    # caught), after the batches that were complete.
    for ext in ("bin", "idx"):
        (tmp_path / f"c.{ext}").write_bytes((data / f"r50k_int32.{ext}").read_bytes())
    dl = DataLoader(TokenDataset(plan(tmp_path, "c", epochs=50, batch_size=2)), num_workers=1)
    it = iter(dl)
    next(it)
    os.truncate(tmp_path / "c.bin", 1024)
    with pytest.raises(OSError) as got:
        for _ in it:
            pass
    text = str(got.value)
    assert re.match(r"^Caught OSError in dquant DataLoader worker 0 \(pid \d+\)\.\n", text), text
    assert re.search(rf"{re.escape(str(tmp_path / 'c.bin'))}: the file is shorter than when it "
                     r"was opened "
                     r"\(644128 bytes; a read needed \d+\): it was truncated or rewritten while "
                     r"being read\n$", text), text
    assert dl.workers is None


def test_a_stalled_ring_worker_times_out_as_torch_s_do(data):
    dl = DataLoader(TokenDataset(plan(data, "r50k_int32", epochs=50, batch_size=2)),
                    num_workers=1, timeout=1)
    it = iter(dl)
    next(it)
    pid = dl.workers.procs[0].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        times_out(it)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the pass's end killed it
            os.kill(pid, signal.SIGCONT)
    assert dl.workers is None


def test_a_loop_that_keeps_every_ring_batch_gets_them_all(data):
    # 200 batches of 64 KiB against rings of 16 slots: the loop's kept batches are copied out
    # of the ring as it needs their slots, and none changes.
    p = plan(data, "r50k_int32", batch_size=64, epochs=10)
    want = cloned(DataLoader(TokenDataset(p), num_workers=2, torch_workers=True))
    dl = DataLoader(TokenDataset(p), num_workers=2)
    kept = []
    for b in dl:
        assert type(dl.workers).__name__ == "RingWorkers"
        kept.append(b)
    assert len(kept) == len(want) > 2 * _ring_workers.SLOTS
    assert_same_batches(kept, want)


def test_persistent_ring_workers_serve_every_pass_and_go_with_their_loader(data):
    p = uneven(data)
    want = cloned(DataLoader(TokenDataset(p), num_workers=3, torch_workers=True))
    dl = DataLoader(TokenDataset(p), num_workers=3, persistent_workers=True)
    assert_same_batches(cloned(dl), want)  # the first pass starts them
    pids = dl.worker_pids()
    procs = list(dl._rings.procs.values())
    assert len(pids) == 3 and all(p.is_alive() for p in procs)
    for _ in range(2):  # later passes: the same processes, the whole stream again
        got = []
        for b in dl:
            assert dl.worker_pids() == pids
            got.append({k: v.clone() for k, v in b.items()})
        assert_same_batches(got, want)
    # A pass ended early leaves them waiting too, and the next pass resumes after it.
    it = iter(dl)
    head = [{k: v.clone() for k, v in next(it).items()}]
    it.close()
    assert dl.worker_pids() == pids
    assert_same_batches(head + cloned(dl), want)
    assert dl.worker_pids() == pids
    del dl, it
    gc.collect()
    for proc in procs:
        proc.join(10)
    assert [proc.exitcode for proc in procs] == [0, 0, 0]


def test_a_persistent_worker_that_died_between_passes_is_replaced(data):
    p = uneven(data)
    want = cloned(DataLoader(TokenDataset(p), num_workers=2, torch_workers=True))
    dl = DataLoader(TokenDataset(p), num_workers=2, persistent_workers=True)
    assert_same_batches(cloned(dl), want)
    old = dl.worker_pids()
    os.kill(old[1], signal.SIGKILL)
    dl._rings.procs[1].join(10)
    assert_same_batches(cloned(dl), want)
    assert set(dl.worker_pids()).isdisjoint(old)
