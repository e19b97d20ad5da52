"""dquant.megatron against Megatron-Core's own builder: the same samples, index for index.

Every test builds the same config twice, with ``BlendedMegatronDatasetBuilder`` +
``GPTDataset`` (the megatron-core that requirements-test.txt pins) and with
``dquant.megatron.build_train_valid_test_datasets``, and compares whole dicts (keys, dtypes,
shapes, values) at every index, in order, of the splits the tests say so of, and elsewhere at
distinct random indices plus each split's first and last. Every comparison records how many
indices of each split it compared (``COVERAGE``); ``bench/megatron/equivalence.sh`` records
the counts as the ``megatron_equivalence`` area, which the README quotes. The sources are
the Megatron-written fixtures plus datasets written here with Megatron's
``IndexedDatasetBuilder``: tiny documents, many documents, several sequences per document,
and fifty small sources for a blend of fifty.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO
from dquant import megatron as dm

# What a comparison's coverage record says (covered, whole) is read in one place, by the
# script that records the counts.
sys.path.insert(0, str(REPO / "bench" / "megatron"))
from compared import covered, whole  # noqa: E402

EOD = 50256


@pytest.fixture(scope="module")
def corpora(data, tmp_path_factory):
    """Prefixes: the fixtures, and Megatron-written datasets of odd shapes."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    d = tmp_path_factory.mktemp("megatron-order")
    rng = np.random.default_rng(5)

    def write(name, lengths, vocab=EOD, seqs_per_doc=1, dtype=np.int32):
        b = IndexedDatasetBuilder(str(d / f"{name}.bin"), dtype=dtype)
        for n in lengths:
            doc = rng.integers(0, vocab, size=n).astype(dtype)
            doc[-1] = EOD if n else 0
            cut = [n // seqs_per_doc] * (seqs_per_doc - 1)
            b.add_document(doc, cut + [n - sum(cut)])
        b.finalize(str(d / f"{name}.idx"))
        return str(d / name)

    for name in ("r50k_int32", "r50k_uint16"):
        for ext in ("bin", "idx"):
            shutil.copy(data / f"{name}.{ext}", d / f"{name}.{ext}")
    return {
        "int32": str(d / "r50k_int32"),
        "uint16": str(d / "r50k_uint16"),
        # Documents of 1 to 3 tokens: samples span many of them.
        "tiny": write("tiny", rng.integers(1, 4, size=300)),
        # Many documents of Zipf-like lengths, and sequences split in two per document.
        "many": write("many", np.minimum(rng.zipf(1.5, size=3000), 400) + 1),
        "multiseq": write("multiseq", rng.integers(2, 60, size=200), seqs_per_doc=2),
        "u16": write("u16", rng.integers(5, 90, size=150), vocab=60000, dtype=np.uint16),
        # Fifty small sources of 20 to 60 documents each, for a blend of fifty.
        **{f"s{i:02}": write(f"s{i:02}", rng.integers(3, 120, size=rng.integers(20, 61)))
           for i in range(50)},
    }


# What each comparison covered: one record a config, written out by `_coverage` below.
COVERAGE: list = []


@pytest.fixture(scope="module", autouse=True)
def _coverage():
    """After the module: every config's compared indices per split, as JSON lines, to
    $DQUANT_MEGATRON_COVERAGE when it is set (bench/megatron/equivalence.sh records them)."""
    yield
    out = os.environ.get("DQUANT_MEGATRON_COVERAGE")
    if out:
        with open(out, "w") as f:
            for rec in COVERAGE:
                f.write(json.dumps(rec) + "\n")


def compare(num_samples, samples=60, seed=0, **kw):
    """Builds both ways and compares ``samples`` distinct random indices of every split and
    its first and last (``samples=None``: every index, in order); records the coverage and
    returns dquant's datasets."""
    kw.setdefault("eod", EOD)
    config = dm._gpt_dataset_config(**kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = dm.build_train_valid_test_datasets(config=config, num_samples=num_samples)
        theirs = dm.megatron_core_datasets(config, num_samples)
    _record(ours, dm.compare_splits(ours, theirs, samples, seed), num_samples, kw)
    return ours


def _record(ours, compared, num_samples, kw):
    """One comparison's coverage; ``config`` names the config whatever the path to its
    sources (a temporary directory here, ``data/`` on the agent), so that a config compared
    in-process and through an agent counts once."""
    def named(v):
        if isinstance(v, str) and os.sep in v:
            return Path(v).name
        if isinstance(v, (list, tuple)):
            return [named(x) for x in v]
        return v

    config = {k: named(v) for k, v in sorted(kw.items())}
    COVERAGE.append({
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
        "config": json.dumps([list(num_samples), config], sort_keys=True),
        "splits": [None if d is None else len(d) for d in ours],
        "compared": compared,
    })


def test_one_source_one_epoch_every_index(corpora):
    train, valid, test = compare(
        [None, None, None], samples=None,
        blend=([corpora["int32"]], None), split="90,7,3", sequence_length=64, random_seed=1234,
    )
    assert len(train) > 1000 and len(valid) > 0 and len(test) > 0
    assert COVERAGE[-1]["compared"] == [len(train), len(valid), len(test)]
    item = train[5]
    assert list(item) == ["tokens", "labels", "attention_mask", "loss_mask", "position_ids"]
    assert item["tokens"].dtype == torch.int64 and item["tokens"].shape == (64,)
    assert item["attention_mask"].shape == (1, 64, 64)


@pytest.mark.parametrize("seed", [0, 1, 1234, 2**32 - 1])
def test_seeds_and_multi_epoch_runs(corpora, seed):
    # 28 documents, ~150 k tokens: 40 000 samples of 32 is about 8 epochs.
    compare(
        [40_000, 500, 100],
        blend=([corpora["int32"]], None), split="90,7,3", sequence_length=32, random_seed=seed,
    )


@pytest.mark.parametrize("extra_samples", [0, 1, 100, 2500, 4000])
def test_separate_final_epoch_both_ways(corpora, extra_samples):
    """The final epoch is shuffled apart below 80% use: both sides of the threshold."""
    [per_epoch] = [len(dm.build_train_valid_test_datasets(
        blend=([corpora["tiny"]], None), split="1", sequence_length=5, random_seed=9,
        num_samples=[None, None, None], eod=EOD)[0])]
    n = 2 * per_epoch + extra_samples
    compare([n, None, None], samples=400,
            blend=([corpora["tiny"]], None), split="1", sequence_length=5, random_seed=9)


FIFTY = [f"s{i:02}" for i in range(50)]


@pytest.mark.parametrize("weighted", [True, False])
def test_a_blend_of_fifty_sources(corpora, weighted):
    """Weighted: the greedy blend over fifty sources in three splits. Unweighted: the
    exhaustive blend, each source in proportion to its size, in one split (with three, some
    small source's valid split is empty, a zero weight both sides refuse)."""
    weights = [1 + (i * 37 % 11) / 4 for i in range(50)] if weighted else None
    sizes = [6000, 400, 200] if weighted else [None, None, None]
    compare(sizes, samples=300, blend=([corpora[n] for n in FIFTY], weights),
            split="90,7,3" if weighted else "1", sequence_length=24, random_seed=50)
    assert covered(COVERAGE[-1])


def _epoch(corpora, name, sequence_length, seed):
    """Samples in one epoch of source ``name``'s train split (``split="1"``)."""
    return len(dm.build_train_valid_test_datasets(
        blend=([corpora[name]], None), split="1", sequence_length=sequence_length,
        random_seed=seed, num_samples=[None, None, None], eod=EOD)[0])


@pytest.mark.parametrize("epochs", [1, 2, 5])
@pytest.mark.parametrize("off", [-1, 0, 1])
def test_num_samples_within_one_of_an_epoch_boundary(corpora, epochs, off):
    per_epoch = _epoch(corpora, "multiseq", 16, 31)
    compare([epochs * per_epoch + off, None, None], samples=None,
            blend=([corpora["multiseq"]], None), split="1", sequence_length=16, random_seed=31)
    assert whole(COVERAGE[-1])


def test_num_samples_within_one_of_an_epoch_boundary_in_a_blend(corpora):
    per_epoch = _epoch(corpora, "tiny", 8, 2)
    for n in (per_epoch - 1, per_epoch, per_epoch + 1, 3 * per_epoch + 1):
        compare([n, 20, 20], samples=400, blend=([corpora["tiny"], corpora["multiseq"]], [2, 1]),
                split="80,10,10", sequence_length=8, random_seed=2)


@pytest.mark.parametrize("extra", [True, False])
def test_sequence_length_one(corpora, extra):
    compare([3000, 200, 100], samples=400, blend=([corpora["tiny"], corpora["int32"]], [1, 1]),
            split="90,7,3", sequence_length=1, random_seed=6, add_extra_token_to_sequence=extra,
            reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True)
    compare([None, None, None], samples=None, blend=([corpora["multiseq"]], None), split="1",
            sequence_length=1, random_seed=6, add_extra_token_to_sequence=extra)
    assert whole(COVERAGE[-1])


def test_tiny_documents_and_tiny_sequences(corpora):
    compare([3000, 100, 100], samples=500,
            blend=([corpora["tiny"]], None), split="8,1,1", sequence_length=2, random_seed=4)


def test_weighted_blend_of_three_sources_weights_not_summing_to_one(corpora):
    train, _, _ = compare(
        [5000, 300, 300], samples=300,
        blend=([corpora["int32"], corpora["tiny"], corpora["many"]], [0.3, 2.0, 0.45]),
        split="90,8,2", sequence_length=16, random_seed=11,
    )
    assert "dataset_id" in train[0] and train[0]["dataset_id"].dtype == np.int16


def test_unweighted_blends_sized_and_exhaustive(corpora):
    blend = ([corpora["int32"], corpora["uint16"], corpora["multiseq"], corpora["u16"]], None)
    compare([None, None, None], samples=300, blend=blend, split="80,15,5", sequence_length=24, random_seed=2)
    compare([700, 50, 10], samples=300, blend=blend, split="80,15,5", sequence_length=24, random_seed=2)


def test_blend_per_split(corpora):
    compare(
        [2000, 100, None], samples=200,
        blend_per_split=[
            ([corpora["int32"], corpora["many"]], [1, 3]),
            ([corpora["tiny"]], None),
            ([corpora["multiseq"], corpora["u16"]], None),
        ],
        sequence_length=32, random_seed=5,
    )


def test_a_split_left_empty_and_absent_splits(corpora):
    # 28 documents at 969/30/1: the test split gets no document (0 samples, as Megatron).
    train, valid, test = compare([None, None, None], blend=([corpora["int32"]], None),
                                 split="969,30,1", sequence_length=16, random_seed=1)
    assert len(test) == 0
    train, valid, test = compare([100, None, None], blend=([corpora["int32"]], None),
                                 split="100,0,0", sequence_length=16, random_seed=1)
    assert valid is None and test is None


def test_surplus_and_masks_and_no_extra_token(corpora):
    compare(
        [3000, 200, 50], samples=200,
        blend=([corpora["many"], corpora["int32"]], [0.7, 0.3]), split="90,8,2",
        sequence_length=48, random_seed=21, mid_level_dataset_surplus=0.1,
        reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True,
    )
    compare(
        [1000, 100, 50], samples=200,
        blend=([corpora["many"]], None), split="90,8,2", sequence_length=48, random_seed=21,
        add_extra_token_to_sequence=False, create_attention_mask=False, eod_mask_loss=True,
        drop_last_partial_validation_sequence=False,
    )


# What the seeded draw of test_random_configs gives: configs drawn until forty were compared;
# of those compared, how many compared 100 indices or more of every non-empty split, and how
# many every index of every split; configs both sides refuse, and configs whose requested
# samples lie in documents with no tokens (Megatron-Core loops forever there, so nothing runs
# it). A change to the draw or to what either side accepts changes these numbers: a test
# that compared less says so here.
RANDOM_CONFIGS = {"drawn": 54, "compared": 40, "covered": 18, "whole": 1, "refused": 1,
                  "no_tokens": 13}


def _random_config(rng, corpora):
    names = [n for n in corpora if n not in FIFTY]
    k = rng.choice([1, 1, 2, 3, 5])
    prefixes = [corpora[rng.choice(names)] for _ in range(k)]
    weights = None if rng.random() < 0.4 else [rng.uniform(0.05, 3) for _ in range(k)]
    if weights is None and rng.random() < 0.5:
        sizes = [None, None, None]
    else:
        sizes = [rng.randint(1, 20_000), rng.randint(1, 500), rng.randint(1, 200)]
    split = ",".join(str(rng.choice([0, 1, 5, 30, 90, 969])) for _ in range(3))
    if split in ("0,0,0",) or split.split(",")[0] == "0":
        split = "90,5,5"
    kw = dict(
        blend=(prefixes, weights), split=split,
        sequence_length=rng.choice([2, 3, 8, 31, 64, 257]), random_seed=rng.randrange(2**32),
        reset_position_ids=rng.random() < 0.3, reset_attention_mask=rng.random() < 0.3,
        eod_mask_loss=rng.random() < 0.3, add_extra_token_to_sequence=rng.random() < 0.8,
        mid_level_dataset_surplus=rng.choice([0.005, 0.05, 0.5]),
        create_attention_mask=rng.random() < 0.5,
    )
    return sizes, kw


def test_random_configs(corpora):
    """Configs drawn at random over every knob (a seeded draw: rerunnable) until forty were
    compared; each compares 150 distinct random indices of every split besides its first and
    last, or every index of a split that small. The outcome of every draw is counted and
    asserted."""
    rng = random.Random(2026)
    outcome = dict.fromkeys(RANDOM_CONFIGS, 0)
    while outcome["compared"] < RANDOM_CONFIGS["compared"] and outcome["drawn"] < 200:
        sizes, kw = _random_config(rng, corpora)
        outcome["drawn"] += 1
        try:
            compare(sizes, samples=150, seed=rng.randrange(1000), **kw)
        except ValueError as e:
            if "hold no tokens" in str(e):
                outcome["no_tokens"] += 1
                continue
            # dquant refuses what Megatron-Core cannot build: Megatron must fail too.
            with pytest.raises((AssertionError, IndexError, ValueError, ZeroDivisionError)):
                dm.megatron_core_datasets(dm._gpt_dataset_config(eod=EOD, **kw), sizes)
            outcome["refused"] += 1
            continue
        outcome["compared"] += 1
        outcome["covered"] += covered(COVERAGE[-1])
        outcome["whole"] += whole(COVERAGE[-1])
    assert outcome == RANDOM_CONFIGS


def test_restart_at_any_consumed_samples_is_megatrons_batch(corpora):
    """A job resumes at consumed_samples by indexing: the dataset rebuilt from the config
    alone gives, from there on, the whole batches Megatron-Core's own dataset gives."""
    kw = dict(blend=([corpora["int32"], corpora["many"]], [1.0, 1.0]), split="90,8,2",
              sequence_length=32, random_seed=77, eod=EOD)
    num_samples = [4000, 40, 40]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = dm.megatron_core_datasets(dm._gpt_dataset_config(**kw), num_samples)[0]
    for consumed in (0, 1, 1237, 3992, 3999):
        again = dm.build_train_valid_test_datasets(num_samples=num_samples, **kw)[0]
        for start in range(consumed, min(consumed + 24, len(theirs)), 8):
            idx = list(range(start, min(start + 8, len(theirs))))
            got = again.get_batch(idx)
            want = torch.utils.data.default_collate([theirs[i] for i in idx])
            assert list(got) == list(want)
            for k in want:
                assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), (start, k)


def test_get_batch_is_the_stack_of_items(corpora):
    train, _, _ = dm.build_train_valid_test_datasets(
        blend=([corpora["int32"], corpora["tiny"]], [1, 1]), split="90,8,2", sequence_length=16,
        random_seed=3, num_samples=[500, 10, 10], eod=EOD, reset_position_ids=True,
        reset_attention_mask=True, eod_mask_loss=True)
    # A small batch is read on one thread; one of 16 or more is split between threads, here
    # unevenly (37 samples).
    for idx in ([5, 0, 499, 17], [5, 0, 499, 17, *range(100, 133)]):
        batch = train.get_batch(idx)
        items = [train[i] for i in idx]
        for k in batch:
            want = torch.utils.data.default_collate([it[k] for it in items])
            assert batch[k].dtype == want.dtype and torch.equal(batch[k], want), (len(idx), k)


def test_bad_input_gets_clear_errors(corpora, tmp_path):
    with pytest.raises(IndexError, match="out of bounds"):
        dm.build_train_valid_test_datasets(
            blend=([corpora["int32"]], None), split="1", sequence_length=16, random_seed=1,
            eod=EOD)[0][10**9]
    with pytest.raises(FileNotFoundError):
        dm.build_train_valid_test_datasets(
            blend=([str(tmp_path / "nope")], None), split="1", sequence_length=16,
            random_seed=1, eod=EOD)
    with pytest.raises(ValueError, match=r"split \"1,1,1,1\": more than three parts"):
        dm.build_train_valid_test_datasets(
            blend=([corpora["int32"]], None), split="1,1,1,1", sequence_length=16,
            random_seed=1, eod=EOD)
    with pytest.raises(ValueError, match="has weights but no number of samples"):
        dm.build_train_valid_test_datasets(
            blend=([corpora["int32"], corpora["tiny"]], [1, 2]), split="1", sequence_length=16,
            random_seed=1, eod=EOD)
    with pytest.raises(ValueError, match="samples requested from documents that hold no tokens"):
        dm.build_train_valid_test_datasets(
            blend=([corpora["int32"]], None), split="969,30,1", sequence_length=16,
            random_seed=1, eod=EOD, num_samples=[10, 10, 10])


def test_a_source_truncated_under_the_datasets_fails_the_reads_not_the_process(data, tmp_path):
    """The `.bin` is mapped (as Megatron-Core maps it); truncated under the datasets, a read of
    its missing bytes raises naming the file, where Megatron-Core's map ends the process with
    SIGBUS (pytest's faulthandler is installed: the guard runs first and hands it nothing)."""
    for ext in ("bin", "idx"):
        shutil.copy(data / f"r50k_int32.{ext}", tmp_path / f"victim.{ext}")
    train = dm.build_train_valid_test_datasets(
        blend=([str(tmp_path / "victim")], None), split="1", sequence_length=64,
        random_seed=1, eod=EOD, num_samples=[200, None, None])[0]
    first = train[0]["tokens"].clone()
    size = (tmp_path / "victim.bin").stat().st_size
    with open(tmp_path / "victim.bin", "r+b") as f:
        f.truncate(4096)
    want = (f"{tmp_path / 'victim.bin'}: the file is shorter than when it was opened ({size} "
            "bytes; a read needed ")
    with pytest.raises(OSError) as e:
        for i in range(len(train)):
            train[i]
    assert str(e.value).startswith(want), str(e.value)
    assert str(e.value).endswith("it was truncated or rewritten while being read")
    assert first.shape == (64,)


def test_from_megatron_args_maps_megatron_lm_arguments(corpora):
    from types import SimpleNamespace

    args = SimpleNamespace(
        data_path=["30", corpora["int32"], "70", corpora["tiny"]], split="90,8,2", seq_length=16,
        seed=42, train_samples=None, train_iters=100, global_batch_size=8, eval_iters=2,
        eval_interval=50, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=True, create_attention_mask_in_dataloader=False,
    )
    kw = dm.from_megatron_args(args)
    assert kw["blend"] == ([corpora["int32"], corpora["tiny"]], [30.0, 70.0])
    # Megatron-LM: train 100 x 8; valid (100 // 50 + 1) x 2 x 8; test 2 x 8.
    assert kw["num_samples"] == [800, 48, 16]
    num_samples = kw.pop("num_samples")
    compare(num_samples, samples=100, eod=EOD, **kw)


# Through an agent: the agent serves the corpora directory as root "data", builds the
# indices there and serves samples by index; the trainer's process holds no index.


@pytest.fixture(scope="module")
def mega_agent(corpora, tmp_path_factory):
    from conftest import Agent

    a = Agent(Path(corpora["tiny"]).parent, tmp_path_factory.mktemp("msock") / "agent.sock")
    yield a
    a.stop()


def named(kw):
    """``kw`` with every prefix named as the agent's dataset (``data/NAME``)."""

    def n(b):
        return None if b is None else ([f"data/{Path(p).name}" for p in b[0]], b[1])

    out = dict(kw)
    if out.get("blend") is not None:
        out["blend"] = n(out["blend"])
    if out.get("blend_per_split") is not None:
        out["blend_per_split"] = [n(b) for b in out["blend_per_split"]]
    return out


def compare_agent(address, num_samples, samples=150, seed=0, **kw):
    """Megatron-Core's datasets built here, dquant's by the agent at ``address``: compared
    at distinct random indices of every split and its first and last (every index of a
    split that small); records the coverage and returns both."""
    kw.setdefault("eod", EOD)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = dm.megatron_core_datasets(dm._gpt_dataset_config(**kw), num_samples)
    ours = dm.build_train_valid_test_datasets(agent=address, num_samples=num_samples, **named(kw))
    _record(ours, dm.compare_splits(ours, theirs, samples, seed), num_samples, kw)
    return ours, theirs


AGENT_CONFIGS = [
    dict(num_samples=[3000, 200, 50], split="80,15,5", sequence_length=48, random_seed=99,
         blend_keys=(["int32", "many", "u16"], [0.5, 0.2, 0.6])),
    dict(num_samples=[40_000, None, None], split="90,10,0", sequence_length=32, random_seed=5,
         blend_keys=(["int32"], None), reset_position_ids=True, reset_attention_mask=True,
         eod_mask_loss=True, drop_last_partial_validation_sequence=False,
         create_attention_mask=False),
    dict(num_samples=[None, None, None], split="90,5,5", sequence_length=4, random_seed=3,
         blend_keys=(["tiny", "multiseq"], None), add_extra_token_to_sequence=False),
]


def _agent_kw(corpora, c):
    c = dict(c)
    keys, w = c.pop("blend_keys")
    return dict(blend=([corpora[k] for k in keys], w), **c)


def _address(agent, transport):
    """The agent's address for samples over ``transport``: its TCP port, a shared-memory ring
    handed over on its Unix socket, or that socket for control and TCP for samples."""
    return {"tcp": agent.uri, "shm": agent.socket,
            "unix+tcp": f"{agent.socket}?transport=tcp"}[transport]


@pytest.mark.parametrize("transport", ["tcp", "shm", "unix+tcp"])
def test_through_an_agent_the_same_samples(corpora, mega_agent, transport):
    address = _address(mega_agent, transport)
    for c in AGENT_CONFIGS:
        ours, theirs = compare_agent(address, **_agent_kw(corpora, c))
        for a, b in zip(ours, theirs):
            if a is None or len(a) < 9:
                continue
            # A batch in one round trip, and a DataLoader's batch read through __getitems__,
            # are the stacks of Megatron's items.
            idx = [len(a) - 1, 0, 7, 3]
            want = torch.utils.data.default_collate([b[i] for i in idx])
            for got in (a.get_batch(idx), torch.utils.data.default_collate(a.__getitems__(idx))):
                assert list(got) == list(want)
                for k in want:
                    assert torch.equal(got[k], want[k]), k


def _agent_train(corpora, address):
    """The first config's train split through the agent at ``address``, Megatron-Core's
    beside it, and a function that opens the agent's again."""
    kw = _agent_kw(corpora, AGENT_CONFIGS[0])
    num_samples = kw.pop("num_samples")

    def open_again():
        return dm.build_train_valid_test_datasets(
            agent=address, num_samples=num_samples, eod=EOD, **named(kw))[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = dm.megatron_core_datasets(dm._gpt_dataset_config(eod=EOD, **kw), num_samples)[0]
    return open_again(), theirs, open_again


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_through_an_agent_a_restart_needs_only_the_index_and_finds_the_build(
        corpora, mega_agent, transport):
    train, theirs, open_again = _agent_train(corpora, _address(mega_agent, transport))
    assert train._order.was_cached()
    for consumed in (0, 1, 999, 2990):
        again = open_again()
        # A sequential sampler's micro-batches of 2 from consumed_samples on, rank 1 of 2.
        for step in range(3):
            start = consumed + step * 4 + 2
            idx = [i for i in (start, start + 1) if i < len(again)]
            got = again.get_batch(idx)
            want = torch.utils.data.default_collate([theirs[i] for i in idx])
            for k in want:
                assert torch.equal(got[k], want[k]), (consumed, k)


def test_through_an_agent_dataloader_workers_open_their_own_sessions(corpora, mega_agent):
    train, theirs, _ = _agent_train(corpora, mega_agent.socket)
    train[0]  # the parent's session is in use before the workers fork
    batches = [list(range(s, s + 4)) for s in range(100, 140, 4)]
    loader = torch.utils.data.DataLoader(train, batch_sampler=batches, num_workers=2)
    for idx, got in zip(batches, loader):
        want = torch.utils.data.default_collate([theirs[i] for i in idx])
        for k in want:
            assert torch.equal(got[k], want[k]), (idx, k)


def test_through_an_agent_bad_input_gets_clear_errors(corpora, mega_agent, tmp_path):
    kw = dict(blend=(["data/r50k_int32"], None), split="90,10,0", sequence_length=32,
              random_seed=1, eod=EOD)
    train, _, _ = dm.build_train_valid_test_datasets(agent=mega_agent.uri, **kw)
    with pytest.raises(IndexError, match=f"index {len(train)} is out of bounds"):
        train[len(train)]
    with pytest.raises(NotImplementedError, match="keeps its indices on the agent"):
        train.pieces(0)
    with pytest.raises(NotImplementedError, match="keeps its indices on the agent"):
        train.samples_of(0, 0)
    with pytest.raises(FileNotFoundError, match='dataset "data/nope": no such dataset'):
        dm.build_train_valid_test_datasets(agent=mega_agent.uri, **{**kw, "blend": (["data/nope"], None)})
    with pytest.raises(ValueError, match="name the agent only"):
        dm.build_train_valid_test_datasets(agent=mega_agent.uri + "/data/x", **kw)
    with pytest.raises(ConnectionError):
        dm.build_train_valid_test_datasets(agent=str(tmp_path / "no.sock"), **kw)


def test_path_to_cache_keeps_the_indices_and_a_second_open_reads_them(corpora, tmp_path):
    kw = dict(blend=([corpora["int32"], corpora["many"]], [0.4, 0.6]), split="90,8,2",
              sequence_length=32, random_seed=8, eod=EOD, num_samples=[2000, 50, 20])
    first = dm.build_train_valid_test_datasets(path_to_cache=str(tmp_path), **kw)
    kept = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.dqmi")}
    assert len(kept) == 6, "two sources x three splits"
    again = dm.build_train_valid_test_datasets(path_to_cache=str(tmp_path), **kw)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.dqmi")} == kept, "read, not rebuilt"
    dm.compare_splits(again, first, samples=300)
    # A damaged file is built again, and the samples are the same.
    victim = sorted(kept)[0]
    victim.write_bytes(victim.read_bytes()[:-9])
    dm.compare_splits(dm.build_train_valid_test_datasets(path_to_cache=str(tmp_path), **kw), first)


def test_samples_of_is_pieces_the_other_way(corpora):
    """A document's samples, found through Megatron's arrays inverted once, are exactly the
    samples whose pieces name it: a weighted blend of three sources (tiny documents spanning
    many per sample, several epochs) and a lone dataset with two sequences per document."""
    configs = [
        dict(blend=([corpora["int32"], corpora["tiny"], corpora["many"]], [0.3, 2.0, 0.45]),
             split="90,8,2", sequence_length=16, random_seed=11, num=[3000, 200, 200]),
        dict(blend=([corpora["multiseq"]], None), split="100,0,0", sequence_length=24,
             random_seed=3, num=[900, None, None]),
    ]
    built = []
    for c in configs:
        num = c.pop("num")
        datasets = dm.build_train_valid_test_datasets(config=dm._gpt_dataset_config(eod=EOD, **c), num_samples=num)
        built.append(datasets[0])
        for ds in (d for d in datasets if d is not None):
            holding = {}
            for i in range(len(ds)):
                for prefix, seq, _, length in ds.pieces(i)[1]:
                    if length > 0 and holding.setdefault((prefix, seq), [])[-1:] != [i]:
                        holding[(prefix, seq)].append(i)
            assert holding
            for (prefix, seq), want in sorted(holding.items())[::7]:
                assert ds.samples_of(prefix, seq) == want, (prefix, seq)
            # A sequence no sample reads, and one past the source's end: none.
            prefix = next(iter(holding))[0]
            assert ds.samples_of(prefix, 10**9) == []
    with pytest.raises(ValueError, match="^source 9: the build has 3 sources$"):
        built[0].samples_of(9, 0)
