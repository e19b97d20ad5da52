"""Boundary outputs against Megatron-Core's own `_get_ltor_masks_and_position_ids`: dquant's
position_ids and loss_mask equal Megatron's on the fixtures and on blended, shuffled and
sharded plans, in-process and through an agent over TCP and shared memory; cu_seqlens agree
with those positions; TokenDataset yields them under Megatron's names and dtypes, and resumes
with them."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import dquant
from conftest import on_agent, plan
from dquant.torch import DataLoader, TokenDataset

with warnings.catch_warnings():
    # Megatron warns that Transformer Engine and Apex are absent; the dataset code needs
    # neither.
    warnings.simplefilter("ignore")
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

EOD = 50256
OUTPUTS = {"boundaries": "eod", "eod": EOD, "position_ids": True, "loss_mask": True,
           "cu_seqlens": True}


def megatron(inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Megatron's loss_mask and position_ids of one sample's inputs (GPTDataset's flags
    reset_position_ids and eod_mask_loss)."""
    _, mask, pos = _get_ltor_masks_and_position_ids(
        torch.from_numpy(inputs.astype(np.int64)), EOD, True, False, True, False
    )
    return mask.numpy(), pos.numpy()


def check_batch(arr: np.ndarray) -> int:
    """Asserts the batch's outputs equal Megatron's; returns how many documents start
    inside it."""
    b = arr.base
    pos, mask = b.position_ids(), b.loss_mask()
    cu, longest = b.cu_seqlens()
    seq_len = arr.shape[1] - 1
    assert pos.dtype == np.int64 and mask.dtype == np.float32 and cu.dtype == np.int32
    assert pos.shape == mask.shape == (arr.shape[0], seq_len)
    megatron_pos = np.empty_like(pos)
    for k in range(arr.shape[0]):
        want_mask, megatron_pos[k] = megatron(arr[k, :-1])
        np.testing.assert_array_equal(mask[k], want_mask)
        np.testing.assert_array_equal(pos[k], megatron_pos[k])
    # cu_seqlens against the document starts Megatron's own position ids imply: a segment
    # starts wherever Megatron's position is 0, in the samples laid end to end (each
    # sample's first token is such a start).
    flat = megatron_pos.reshape(-1)
    want_cu = np.append(np.flatnonzero(flat == 0), flat.size).astype(np.int32)
    assert want_cu[0] == 0 and set(range(0, flat.size, seq_len)) <= set(want_cu.tolist())
    np.testing.assert_array_equal(cu, want_cu)
    assert longest == np.diff(want_cu).max()
    offsets, starts = b.doc_starts
    assert offsets.dtype == starts.dtype == np.uint32 and len(offsets) == arr.shape[0] + 1
    return len(starts)


def test_the_fixtures_equal_megatron(data):
    for name, out in (("r50k_int32", "i32"), ("r50k_uint16", "u16"), ("r50k_uint16", "i64")):
        p = plan(data, name, seq_len=511, batch_size=4, output=out, **OUTPUTS)
        docs = sum(check_batch(a) for a in dquant.open(p, offload=False))
        assert docs > 20, name
    # The index's document starts give the same outputs: every fixture document ends with EOD.
    p = plan(data, "r50k_int32", seq_len=511, batch_size=4, **OUTPUTS)
    by_index = dict(p, boundaries="documents")
    del by_index["eod"]
    for a, b in zip(dquant.open(p, offload=False), dquant.open(by_index, offload=False)):
        np.testing.assert_array_equal(a.base.position_ids(), b.base.position_ids())
        np.testing.assert_array_equal(a.base.loss_mask(), b.base.loss_mask())


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_blended_shuffled_sharded_plans_equal_megatron_through_the_agent(data, agent, transport):
    where = agent.uri if transport == "tcp" else agent.socket
    for rank in range(3):
        p = plan(data, ("r50k_int32", 0.7), ("r50k_uint16", 0.3), seq_len=255, batch_size=3,
                 seed=11, samples=120, world=3, rank=rank, **OUTPUTS)
        local = list(dquant.open(p, offload=False))
        remote = list(dquant.open(on_agent(p, data), agent=where, transport=transport))
        assert remote[0].base.in_ring == (transport == "shm")
        assert len(local) == len(remote) > 0
        for a, b in zip(local, remote):
            np.testing.assert_array_equal(a, b)
            for x, y in zip(a.base.doc_starts, b.base.doc_starts):
                np.testing.assert_array_equal(x, y)
            check_batch(b)


def test_without_boundaries_the_outputs_say_what_to_set(data):
    a = next(iter(dquant.open(plan(data), offload=False)))
    assert a.base.doc_starts is None
    with pytest.raises(ValueError, match=r'^loss_mask: the plan has no boundaries \(set '
                       r'boundaries = "eod" with eod = ID, or "documents"\)$'):
        a.base.loss_mask()
    with pytest.raises(ValueError, match="^position_ids: needs boundaries"):
        dquant.open(plan(data, position_ids=True), offload=False)


def test_token_dataset_yields_megatron_names_and_resumes(data):
    p = plan(data, ("r50k_int32", 0.5), ("r50k_uint16", 0.5), seq_len=127, batch_size=2,
             samples=60, seed=5, **OUTPUTS)
    items = list(DataLoader(TokenDataset(p, names="megatron"), num_workers=2))
    first = items[0]
    assert set(first) == {"tokens", "labels", "loss_mask", "position_ids", "cu_seqlens",
                          "max_seqlen"}
    assert first["tokens"].dtype == first["labels"].dtype == torch.int64
    assert first["loss_mask"].dtype == torch.float32
    assert first["position_ids"].dtype == torch.int64
    assert first["cu_seqlens"].dtype == first["max_seqlen"].dtype == torch.int32
    for it in items:
        for k in range(it["tokens"].shape[0]):
            mask, pos = megatron(it["tokens"][k].numpy())
            np.testing.assert_array_equal(it["loss_mask"][k].numpy(), mask)
            np.testing.assert_array_equal(it["position_ids"][k].numpy(), pos)
    # Resumed from a state dict mid-stream: the same items, outputs included.
    ds = TokenDataset(p, names="megatron")
    head = []
    for it in DataLoader(ds, num_workers=2):
        head.append(it)
        if len(head) == 7:
            break
    ds2 = TokenDataset(p, names="megatron")
    ds2.load_state_dict(json.loads(json.dumps(ds.state_dict())))
    rest = list(DataLoader(ds2, num_workers=2))
    assert len(head) + len(rest) == len(items)
    for got, want in zip(head + rest, items):
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
