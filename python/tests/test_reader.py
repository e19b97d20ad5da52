"""dquant.open and the reader: data, transports, zero copy, read(buf), cursors, errors."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import dquant
from conftest import SHIFT, Agent, on_agent, plan, stream


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_unshuffled_samples_are_the_dataset_tokens(data, tokens):
    L = 127
    for out, dt in (("u16", np.uint16), ("i32", np.int32), ("i64", np.int64)):
        with dquant.open(plan(data, shuffle=False, output=out), offload=False) as r:
            assert r.dtype == np.dtype(dt).name
            assert r.sample_len == L + 1
            assert r.transport == "local"
            arrays = list(r)
        assert all(a.dtype == dt and a.shape[1] == L + 1 for a in arrays)
        assert all(a.shape[0] == 4 for a in arrays[:-1])
        samples = np.concatenate(arrays)
        assert len(samples) == (len(tokens) - 1) // L
        for i in (0, 1, 17, len(samples) - 1):
            np.testing.assert_array_equal(samples[i], tokens[i * L : i * L + L + 1])


def test_offloaded_streams_equal_the_local_one(data, agent):
    # A shuffled 70/30 blend over two epochs with a short last batch, and a u16 one.
    for p in (
        plan(data, ("r50k_int32", 0.7), ("shifted.i32", 0.3), epochs=2, batch_size=5),
        plan(data, "r50k_uint16", output="u16", seed=7),
    ):
        with dquant.open(p, offload=False) as r:
            want = stream(r)
        q = on_agent(p, data)
        for target, transport in (
            (agent.uri, "tcp"),
            (agent.socket, "shm"),
            (agent.uri, "shm"),  # the agent's socket, found through its TCP address
        ):
            with dquant.open(q, agent=target, transport=transport) as r:
                assert r.transport == transport
                got = stream(r)
            assert digest(got) == digest(want), (target, transport)
        # Offload=False with sources on the agent: pulled by range, planned here.
        with dquant.open(q, offload=False, agent=agent.uri) as r:
            assert digest(stream(r)) == digest(want)
        # dquant:// dataset URIs name the agent themselves.
        u = dict(q, sources=[dict(s, uri=f"{agent.uri}/{s['uri']}") for s in q["sources"]])
        with dquant.open(u) as r:
            assert r.transport == "tcp"
            assert digest(stream(r)) == digest(want)


@pytest.mark.parametrize("transport", ["local", "tcp", "shm"])
def test_batches_are_zero_copy_views_that_keep_their_memory(data, agent, transport):
    p = plan(data, "r50k_int32", epochs=3)
    with dquant.open(p, offload=False) as r:
        want = [a.copy() for a in r]
    if transport == "local":
        r = dquant.open(p, offload=False)
    else:
        # A small ring (4 slots) so that kept batches must be copied out of it.
        target = agent.socket + "?slots=4" if transport == "shm" else agent.uri
        r = dquant.open(on_agent(p, data), agent=target)
    kept = []
    for i, a in enumerate(r):
        base = a.base
        # The array views the batch's memory: its base is the reader's buffer object.
        assert isinstance(base, dquant.Batch)
        assert not a.flags.owndata
        assert a.ctypes.data == base.address
        assert a.nbytes == base.nbytes
        assert base.index == i
        assert base.in_ring == (transport == "shm")
        t = torch.from_numpy(a)
        assert t.data_ptr() == base.address  # and torch shares it too
        kept.append(t if i % 2 else a)  # keep every batch, half of them only as tensors
    assert r.cursor()["consumed_samples"] == sum(len(w) for w in want)
    r.close()
    # Every batch is intact after later batches, the end of the stream and the reader's
    # close: kept views of ring slots were copied out before the ring reused their slot.
    assert len(kept) == len(want)
    for k, w in zip(kept, want):
        np.testing.assert_array_equal(np.asarray(k), w)


def test_read_fills_buffers_with_the_stream(data, agent):
    p = plan(data, ("r50k_int32", 0.5), ("shifted.i32", 0.5), batch_size=3)
    with dquant.open(p, offload=False) as r:
        want = stream(r)
    for target in (None, agent.uri, agent.socket):
        r = (
            dquant.open(p, offload=False)
            if target is None
            else dquant.open(on_agent(p, data), agent=target)
        )
        got = bytearray()
        buf = bytearray(1001)  # not a multiple of anything
        arr = np.zeros(777, dtype=np.uint8)
        while True:
            n = r.read(buf if len(got) % 2 == 0 else memoryview(arr))
            if n == 0:
                break
            got += (buf if len(got) % 2 == 0 else arr.tobytes())[:n]
        assert bytes(got) == want
        with pytest.raises(ValueError, match="read: the buffer is read-only"):
            r.read(b"immutable")
        r.close()


def test_resuming_from_a_cursor_yields_exactly_the_rest(data, agent):
    p = plan(data, ("r50k_int32", 0.6), ("shifted.i32", 0.4), epochs=2)
    with dquant.open(p, offload=False) as r:
        full = [a.copy() for a in r]
    for target in (None, agent.uri, agent.socket):
        q = p if target is None else on_agent(p, data)
        kw = {"offload": False} if target is None else {"agent": target}
        with dquant.open(q, **kw) as r:
            head = [next(r).copy() for _ in range(11)]
            cursor = r.cursor()
        cursor = json.loads(json.dumps(cursor))
        with dquant.open(q, cursor=cursor, **kw) as r:
            rest = [a.copy() for a in r]
        assert len(head) + len(rest) == len(full)
        for a, b in zip(head + rest, full):
            np.testing.assert_array_equal(a, b)


def test_plan_forms_and_fields(data, tmp_path):
    p = plan(data, "r50k_int32")
    with dquant.open(p, offload=False) as r:
        want = stream(r)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(p))
    for form in (json.dumps(p), str(f), f):
        with dquant.open(form, offload=False) as r:
            assert stream(r) == want
    # One dataset plus fields.
    with dquant.open(str(data / "r50k_int32"), offload=False, seq_len=127, batch_size=4) as r:
        assert stream(r) == want


def test_bad_plans_raise_value_error_with_the_message(data):
    cases = [
        ({"sources": [{"uri": str(data / "r50k_int32")}], "batch_size": 4}, "missing field `seq_len`"),
        (dict(plan(data), sead=1), "unknown field `sead`"),
        (dict(plan(data), batch_size=0), "batch_size"),
        (dict(plan(data), output="u8"), "u8"),
        (dict(plan(data), rank=2, world=2), "rank"),
        ("{not json", "plan: invalid JSON"),
    ]
    for p, msg in cases:
        with pytest.raises(ValueError, match=msg):
            dquant.open(p, offload=False)
    with pytest.raises(ValueError) as e:
        dquant.open(dict(plan(data), sources=[]), offload=False)
    assert "source" in str(e.value)
    with pytest.raises(
        ValueError,
        match=r"^offload=True needs an agent: pass agent='dquant://HOST:PORT' or the path of its Unix socket",
    ):
        dquant.open(plan(data))
    with pytest.raises(ValueError, match=r"^transport must be 'tcp', 'shm', 'loopback' or None, not 'rdma'$"):
        dquant.open(plan(data), agent="dquant://127.0.0.1:1", transport="rdma")
    with pytest.raises(TypeError):
        dquant.open(42)
    # A token that does not fit the output dtype.
    with pytest.raises(ValueError, match="does not fit|exceeds|too large|u16"):
        with dquant.open(plan(data, "shifted.i32", output="u16"), offload=False) as r:
            list(r)


def test_missing_datasets_raise_file_not_found(data, agent):
    with pytest.raises(FileNotFoundError, match="nope"):
        dquant.open(plan(data, "nope"), offload=False)
    q = on_agent(plan(data, "nope"), data)
    with pytest.raises(FileNotFoundError, match='dataset "data/nope"'):
        dquant.open(q, agent=agent.uri)
    with pytest.raises(FileNotFoundError, match='dataset "data/nope"'):
        dquant.open(q, agent=agent.socket)
    with pytest.raises(FileNotFoundError, match='dataset "data/nope"'):
        dquant.open(q, offload=False, agent=agent.uri)


def test_unreachable_agent_is_a_connection_error(data):
    with pytest.raises(ConnectionError, match="127.0.0.1:1"):
        dquant.open(on_agent(plan(data), data), agent="dquant://127.0.0.1:1")


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_an_agent_killed_mid_stream_raises_and_the_interpreter_lives(data, fresh_agent, transport):
    p = on_agent(plan(data, "r50k_int32", epochs=50), data)
    target = fresh_agent.socket if transport == "shm" else fresh_agent.uri
    r = dquant.open(p, agent=target, transport=transport)
    kept = [next(r) for _ in range(3)]
    fresh_agent.kill()
    with pytest.raises(dquant.AgentError) as e:
        for _ in r:
            pass
    assert "agent" in str(e.value) or "connection" in str(e.value).lower()
    # Batches already delivered stay readable; the reader can be closed; we are alive.
    assert all(k.sum() > 0 for k in kept)
    r.close()
    assert r.closed
    with pytest.raises(ValueError, match="closed dquant reader"):
        next(r)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_sigterm_mid_stream_raises_agent_shutdown_with_the_cursor_to_resume_from(
    data, fresh_agent, tmp_path, transport
):
    local = plan(data, "r50k_int32", epochs=50)
    want = stream(dquant.open(local, offload=False))
    p = on_agent(local, data)
    target = fresh_agent.socket if transport == "shm" else fresh_agent.uri
    r = dquant.open(p, agent=target, transport=transport)
    got = [next(r).tobytes() for _ in range(3)]
    fresh_agent.proc.send_signal(signal.SIGTERM)
    with pytest.raises(dquant.AgentShutdown) as e:
        for a in r:
            got.append(a.tobytes())
    n = e.value.consumed_samples
    assert str(e.value) == f"agent shutting down; resume from consumed_samples {n}"
    assert isinstance(e.value, dquant.AgentError)
    assert r.cursor() == {"epoch": r.cursor()["epoch"], "consumed_samples": n}
    assert fresh_agent.proc.wait(15) == 0
    assert not os.path.exists(fresh_agent.socket)
    # A new agent continues the stream from that cursor: nothing skipped or repeated.
    again = Agent(data, tmp_path / "again.sock")
    try:
        rest = dquant.open(p, agent=again.uri, cursor={"consumed_samples": n})
        assert b"".join(got) + stream(rest) == want
    finally:
        again.stop()


# Reads one batch, then waits for a line (the test stops the agent meanwhile), reads on
# until Ctrl-C, waits for another line (the agent goes on), and reads the rest.
CTRL_C_SCRIPT = r"""
import hashlib, json, signal, sys
import dquant
# Python leaves SIGINT ignored when it starts with it ignored (as under `nohup ... &`, or a
# CI runner that does so): install the usual handler, as an interactive session has.
signal.signal(signal.SIGINT, signal.default_int_handler)
r = dquant.open(json.loads(sys.argv[1]), agent=sys.argv[2], transport="shm")
h = hashlib.sha256()
h.update(next(r).tobytes())
print("first", flush=True)
sys.stdin.readline()
try:
    for a in r:
        h.update(a.tobytes())
    print("ended before the interrupt", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
sys.stdin.readline()
for a in r:
    h.update(a.tobytes())
print(h.hexdigest(), flush=True)
"""


def test_ctrl_c_while_the_agent_stalls_raises_keyboard_interrupt_and_loses_nothing(
    data, fresh_agent
):
    local = plan(data, "r50k_int32", epochs=50)  # 32 MB of int32: 4 rings' worth
    want = hashlib.sha256()
    for a in dquant.open(local, offload=False):
        want.update(a.tobytes())
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CTRL_C_SCRIPT,
            json.dumps(on_agent(local, data)),
            fresh_agent.socket,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def line(timeout: float) -> str:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if not ready:
            proc.kill()
            pytest.fail(f"no line from the reader within {timeout} s")
        return proc.stdout.readline()

    def go() -> None:
        proc.stdin.write("\n")
        proc.stdin.flush()

    try:
        assert line(60) == "first\n"
        os.kill(fresh_agent.proc.pid, signal.SIGSTOP)
        go()
        time.sleep(1.0)  # the reader drains the ring, then waits on the stopped agent
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert line(10) == "interrupted\n"
        assert time.monotonic() - t < 2.0
        os.kill(fresh_agent.proc.pid, signal.SIGCONT)
        go()
        assert line(60) == want.hexdigest() + "\n"
        assert proc.wait(30) == 0
    finally:
        os.kill(fresh_agent.proc.pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()


def test_source_use_says_how_many_epochs_each_source_gave(data, agent):
    from conftest import on_agent
    p = plan(data, ("r50k_int32", 0.5), ("shifted.i32", 0.5), batch_size=5, samples=3000,
             when_exhausted="renormalize")
    p["sources"][1]["max_samples"] = 400
    for r in (dquant.open(p, offload=False), dquant.open(on_agent(p, data), agent=agent.uri)):
        assert r.source_use() == [{"samples": 0, "epochs": 0.0}, {"samples": 0, "epochs": 0.0}]
        for _ in r:
            pass
        used = r.source_use()
        # (161032 - 1) // 127 = 1267 samples an epoch; source 1 stops at its 400.
        assert used == [{"samples": 2600, "epochs": 2600 / 1267},
                        {"samples": 400, "epochs": 400 / 1267}], used
