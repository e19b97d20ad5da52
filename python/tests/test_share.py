"""Shared streams: one plan run once on the agent, read by many readers (TCP and shared
memory), and TokenDataset's tensor-parallel groups sharing one stream per data-parallel
rank."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import dquant
from conftest import on_agent, plan, stream
from dquant.torch import TokenDataset


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def in_threads(*jobs):
    """Runs each job on its own thread (a shared stream paces to its slowest reader, so
    readers of one stream must read at once); returns their results in order."""
    out = [None] * len(jobs)
    errors = []

    def run(i, job):
        try:
            out[i] = job()
        except BaseException as e:  # re-raised below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


def read_all(r) -> bytes:
    with r:
        return stream(r)


def test_a_shared_stream_gives_every_reader_the_plan(data, agent):
    p = plan(data, ("r50k_int32", 0.7), ("shifted.i32", 0.3), epochs=2, wire_codec="auto+lz4")
    with dquant.open(p, offload=False) as r:
        want = digest(stream(r))
    q = on_agent(p, data)
    start = {"epoch": 0, "consumed_samples": 0}
    readers = [
        dquant.open(q, agent=agent.uri, share="py/dp0", share_group=4),
        dquant.open(q, agent=agent.socket, share="py/dp0", share_group=4),
        dquant.subscribe(agent.uri, "py/dp0", cursor=start),
        dquant.subscribe(agent.socket, "py/dp0", cursor=start),
    ]
    assert [r.transport for r in readers] == ["tcp", "shm", "tcp", "shm"]
    got = in_threads(*[lambda r=r: read_all(r) for r in readers])
    assert [digest(g) for g in got] == [want] * 4


def test_subscribing_to_no_stream_or_to_a_lost_cursor_says_why(data, agent):
    with pytest.raises(FileNotFoundError, match='no shared stream "py/none"'):
        dquant.subscribe(agent.uri, "py/none")
    with pytest.raises(ValueError, match="share applies only with offload=True"):
        dquant.open(plan(data), offload=False, share="py/x")


def items_of(ds) -> list:
    """Every item of ``ds`` as a tuple of tensors (inputs, labels)."""
    return [(b["input_ids"].clone(), b["labels"].clone()) for b in ds]


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b)
    )


def test_a_tensor_parallel_group_shares_one_stream_per_data_parallel_rank(data, agent):
    p = on_agent(plan(data, epochs=2, batch_size=3), data)
    tp = 2
    datasets = [
        TokenDataset(
            p,
            agent=target,
            rank=dp,
            world_size=2,
            share=f"py-tp/dp{dp}",
            share_group=tp,
        )
        for dp in range(2)
        for target in (agent.uri, agent.socket)  # one TP rank over TCP, one over shm
    ]
    got = in_threads(*[lambda ds=ds: items_of(ds) for ds in datasets])
    for dp in range(2):
        alone = items_of(TokenDataset(p, agent=agent.uri, rank=dp, world_size=2))
        assert alone, "the rank has batches"
        assert same(got[2 * dp], alone) and same(got[2 * dp + 1], alone), dp
    assert not same(got[0], got[2]), "the data-parallel ranks read different streams"


def test_tensor_parallel_processes_with_dataloader_workers_share_one_stream_per_worker(
    data, agent
):
    """Two processes of one tensor-parallel group, each with 2 DataLoader workers: worker w
    of each reads the stream f"{share}/w{w}", so both processes receive exactly what one
    process alone receives, in the same order."""
    p = on_agent(plan(data, epochs=2, batch_size=3), data)
    script = str(Path(__file__).parent / "tp_rank.py")

    def run(share: str, group: int, n: int) -> list[str]:
        procs = [
            subprocess.Popen(
                [sys.executable, script, agent.socket, json.dumps(p), "1", "2", share,
                 str(group)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        outs = [proc.communicate(timeout=300)[0].strip() for proc in procs]
        assert all(proc.returncode == 0 for proc in procs)
        return outs

    (alone,) = run("-", 0, 1)
    assert int(alone.split()[0]) > 0, alone
    assert run("py-tp-workers/dp1", 2, 2) == [alone, alone]
