"""DataLoader workers hand their batches over through shared memory (dquant._handoff): the
streams equal those handed over torch's way, batch for batch and key for key (boundary
outputs too), through torch's DataLoader and dquant's; views stay views of one slot; slots
come back when the loop drops its batches; a loop that keeps every batch gets them all,
the ones past the free slots torch's way."""

from __future__ import annotations

import gc
import pickle

import pytest
import torch

from conftest import assert_same_batches, plan
from dquant import _handoff
from dquant.torch import DataLoader, TokenDataset

EOD = 50256


def the_plan(data) -> dict:
    return plan(data, ("r50k_int32", 0.7), ("shifted.i32", 0.3), epochs=1, batch_size=3,
                shuffle=True, boundaries="eod", eod=EOD, position_ids=True, loss_mask=True,
                cu_seqlens=True)


def loader(p: dict, own: bool, workers: int):
    ds = TokenDataset(p)
    if own:
        return DataLoader(ds, num_workers=workers)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)


def items(dl, keep: bool = False) -> tuple[list[dict], int]:
    """Every batch (as copies, or the batches themselves with `keep`), and how many came
    through a slot."""
    before = _handoff.rebuilt
    got = []
    for b in dl:
        got.append(b if keep else {k: v.clone() for k, v in b.items()})
    return got, _handoff.rebuilt - before


@pytest.mark.parametrize("own", [False, True], ids=["torch DataLoader", "dquant DataLoader"])
@pytest.mark.parametrize("workers", [1, 2])
def test_batches_through_slots_equal_torch_s_way(data, monkeypatch, own, workers):
    p = the_plan(data)
    # dquant.torch.DataLoader's slots are its socket workers' (ring workers, which it runs for
    # in-process plans, make batches straight into a ring: test_workers.py).
    monkeypatch.setenv("DQUANT_WORKER_RING", "0")
    monkeypatch.setenv("DQUANT_WORKER_SHM", "0")
    want, slotted = items(loader(p, own, workers))
    assert slotted == 0
    monkeypatch.setenv("DQUANT_WORKER_SHM", "1")
    got, slotted = items(loader(p, own, workers))
    assert_same_batches(got, want)
    # Each batch is dropped before the next is taken: every one came through a slot.
    assert slotted == len(got)
    assert {"input_ids", "labels", "position_ids", "loss_mask", "cu_seqlens"} <= set(got[0])


def test_inputs_and_labels_stay_views_of_one_slot(data):
    dl = loader(the_plan(data), own=False, workers=1)
    for b in dl:
        ids, labels = b["input_ids"], b["labels"]
        assert ids.untyped_storage().data_ptr() == labels.untyped_storage().data_ptr()
        assert labels.storage_offset() == ids.storage_offset() + 1
        break


def test_a_loop_that_keeps_every_batch_gets_them_all(data, monkeypatch):
    p = the_plan(data)
    monkeypatch.setenv("DQUANT_WORKER_RING", "0")  # the socket workers' slots
    monkeypatch.setenv("DQUANT_WORKER_SHM", "0")
    want, _ = items(loader(p, own=True, workers=1))
    monkeypatch.setenv("DQUANT_WORKER_SHM", "1")
    got, slotted = items(loader(p, own=True, workers=1), keep=True)
    assert_same_batches(got, want)
    assert len(got) > _handoff.SLOTS
    # The worker's slots ran out while the loop held them: the rest went torch's way.
    assert 0 < slotted < len(got)


def test_a_slot_goes_back_when_its_last_tensor_goes(data):
    """In one process (the worker's pickle unpickled here, as the main process would): a
    batch crosses as a few hundred bytes, rebuilds to the same tensors, and its slot returns
    to the arena only once every view of it is gone."""
    item = {"t": torch.arange(24, dtype=torch.int64).reshape(3, 8)}
    item["a"], item["b"] = item["t"][:, :-1], item["t"][:, 1:]
    arena = _handoff.Arena(4096, slots=2)
    sent = [arena.put(item), arena.put(item)]
    assert arena.put(item) is None, "two slots, both out"
    wire = pickle.dumps(sent[0])
    assert len(wire) < 1000
    got = pickle.loads(wire)
    for k in item:
        assert torch.equal(got[k], item[k]), k
    a = got["a"]
    del got
    gc.collect()
    assert arena.take() is None, "a view of the slot is alive"
    del a
    gc.collect()
    assert arena.take() == sent[0].args[1]


def test_a_worker_whose_memory_cannot_be_mapped_says_what_to_do():
    gone = 2**22 + 1  # above the largest pid_max Linux allows: no such process
    with pytest.raises(RuntimeError, match=r"^dquant: cannot map the batches of DataLoader "
                       rf"worker {gone} \(/proc/{gone}/fd: .*\); set DQUANT_WORKER_SHM=0 to "
                       r"hand them over torch's way$"):
        _handoff._Mapped(gone, 3, 4, 4096)
