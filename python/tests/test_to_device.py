"""dquant.torch.DataLoader(device=...): the loop gets the batches it would get without it,
batch for batch, in memory of their own on that device, with the tensors that shared memory
(input_ids and labels) sharing it still, with and without workers, and its state_dict resumes
as before. CI has no GPU: this runs the path on the CPU device (a copy out of the batch's
memory); bench/gpu checks the CUDA path (pinned staging, a copy on the current stream) on a GPU host,
with the batches' digest computed on the device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import assert_same_batches, cloned, plan
from dquant._to_device import ToDevice
from dquant.torch import DataLoader, TokenDataset


def boundaries(data) -> dict:
    return plan(data, ("r50k_int32", 0.7), ("shifted.i32", 0.3), samples=20, batch_size=3,
                shuffle=True, boundaries="eod", eod=50256, position_ids=True, loss_mask=True,
                cu_seqlens=True, provenance=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_come_in_memory_of_their_own_and_equal_the_host_ones(data, workers):
    p = boundaries(data)
    want = cloned(DataLoader(TokenDataset(p), num_workers=workers))
    dl = DataLoader(TokenDataset(p), num_workers=workers, device="cpu")
    got, held = [], []
    for b in dl:
        assert b["input_ids"].untyped_storage().data_ptr() == b["labels"].untyped_storage().data_ptr()
        assert b["labels"].storage_offset() == b["input_ids"].storage_offset() + 1
        held.append(b)  # nothing the loader does later may change a batch the loop holds
        got.append({k: v.clone() for k, v in b.items()})
    assert_same_batches(got, want)
    assert_same_batches(held, want)
    assert sorted(want[0]) == ["cu_seqlens", "input_ids", "labels", "loss_mask", "max_seqlen",
                               "position_ids", "provenance"]


def test_a_resume_goes_on_as_without_it(data):
    p = boundaries(data)
    full = cloned(DataLoader(TokenDataset(p), num_workers=2))
    ds = TokenDataset(p)
    head = []
    for b in DataLoader(ds, num_workers=2, device="cpu"):
        head.append({k: v.clone() for k, v in b.items()})
        if len(head) == 3:
            break
    ds2 = TokenDataset(p)
    ds2.load_state_dict(ds.state_dict())
    assert_same_batches(head + cloned(DataLoader(ds2, num_workers=2, device="cpu")), full)


def test_views_dtypes_and_entries_that_are_not_tensors_are_kept():
    base = torch.arange(2 * 9, dtype=torch.int64).reshape(2, 9)
    other = torch.arange(6, dtype=torch.int16)
    batch = {"labels": base[:, 1:], "input_ids": base[:, :-1], "odd": other[1::2],
             "scalar": torch.tensor(7, dtype=torch.int32), "tag": {"slot": 1}}
    out = ToDevice("cpu")(batch)
    assert list(out) == list(batch)
    assert out["tag"] is batch["tag"]
    for k in ("labels", "input_ids", "odd", "scalar"):
        assert out[k].dtype == batch[k].dtype and torch.equal(out[k], batch[k]), k
        assert out[k].stride() == batch[k].stride(), k
    assert out["labels"].untyped_storage().data_ptr() == out["input_ids"].untyped_storage().data_ptr()
    assert out["odd"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    base.zero_()
    assert out["labels"][0, 0] == 1


def test_a_tensor_at_an_odd_address_is_moved_on_its_own():
    raw = np.arange(40, dtype=np.uint8)
    odd = torch.from_numpy(raw[1:33].view(np.int64))  # overlaps `even`, 1 byte off
    even = torch.from_numpy(raw[:32].view(np.int64))
    out = ToDevice("cpu")({"odd": odd, "even": even})
    assert torch.equal(out["odd"], odd) and torch.equal(out["even"], even)


def test_pin_memory_with_it_and_a_device_that_is_not_there_are_refused(data):
    ds = TokenDataset(plan(data))
    with pytest.raises(ValueError, match=r"^dquant.torch.DataLoader: device= stages batches in "
                       r"pinned buffers of its own; leave pin_memory False$"):
        DataLoader(ds, device="cpu", pin_memory=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"^device='cuda': this process sees no CUDA device$"):
            DataLoader(ds, device="cuda")
