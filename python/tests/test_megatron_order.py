"""dquant.megatron against Megatron-Core's own builder: the same samples, index for index.

Every test builds the same config twice, with ``BlendedMegatronDatasetBuilder`` +
``GPTDataset`` (the megatron-core that requirements-test.txt pins) and with
``dquant.megatron.build_train_valid_test_datasets``, and compares whole dicts (keys, dtypes,
shapes, values) at every index of small datasets and at random ones of large ones. The
sources are the Megatron-written fixtures plus datasets written here with Megatron's
``IndexedDatasetBuilder``: tiny documents, many documents, several sequences per document.
"""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch

from dquant import megatron as dm

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

    return {
        "int32": str(data / "r50k_int32"),
        "uint16": str(data / "r50k_uint16"),
        # Documents of 1 to 3 tokens: samples span many of them.
        "tiny": write("tiny", rng.integers(1, 4, size=300)),
        # Many documents of Zipf-like lengths, and sequences split in two per document.
        "many": write("many", np.minimum(rng.zipf(1.5, size=3000), 400) + 1),
        "multiseq": write("multiseq", rng.integers(2, 60, size=200), seqs_per_doc=2),
        "u16": write("u16", rng.integers(5, 90, size=150), vocab=60000, dtype=np.uint16),
    }


def compare(num_samples, samples=60, seed=0, **kw):
    """Builds both ways and compares; returns dquant's datasets."""
    kw.setdefault("eod", EOD)
    config = dm._gpt_dataset_config(**kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dm.check(samples=samples, seed=seed, num_samples=num_samples, config=config) == "identical"
    return dm.build_train_valid_test_datasets(config=config, num_samples=num_samples)


def test_one_source_one_epoch_every_index(corpora):
    train, valid, test = compare(
        [None, None, None], samples=10_000,
        blend=([corpora["int32"]], None), split="90,7,3", sequence_length=64, random_seed=1234,
    )
    assert len(train) > 1000 and len(valid) > 0 and len(test) > 0
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


def test_random_configs(corpora):
    """Forty configs drawn at random over every knob (a seeded draw: rerunnable)."""
    rng = random.Random(2026)
    names = list(corpora)
    for _ in range(40):
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
        )
        try:
            compare(sizes, samples=40, seed=rng.randrange(1000), **kw)
        except ValueError as e:
            if "hold no tokens" in str(e):
                continue  # Megatron-Core loops forever there: nothing to run it against
            # dquant refuses what Megatron-Core cannot build: Megatron must fail too.
            with pytest.raises((AssertionError, IndexError, ValueError, ZeroDivisionError)):
                dm.megatron_core_datasets(dm._gpt_dataset_config(eod=EOD, **kw), sizes)


def test_restart_at_any_consumed_samples_needs_only_the_index(corpora):
    """A job resumes at consumed_samples by indexing: the dataset rebuilt from the config
    alone gives the same samples from there on, as Megatron's does."""
    kw = dict(blend=([corpora["int32"], corpora["many"]], [1.0, 1.0]), split="90,8,2",
              sequence_length=32, random_seed=77, num_samples=[4000, 40, 40], eod=EOD)
    first, _, _ = dm.build_train_valid_test_datasets(**kw)
    again, _, _ = dm.build_train_valid_test_datasets(**kw)
    for consumed in (0, 1, 1237, 3999):
        a, b = first.get_batch(range(consumed, min(consumed + 8, 4000))), again[consumed]
        assert torch.equal(a["tokens"][0], b["tokens"])


def test_get_batch_is_the_stack_of_items(corpora):
    train, _, _ = dm.build_train_valid_test_datasets(
        blend=([corpora["int32"], corpora["tiny"]], [1, 1]), split="90,8,2", sequence_length=16,
        random_seed=3, num_samples=[500, 10, 10], eod=EOD, reset_position_ids=True,
        reset_attention_mask=True, eod_mask_loss=True)
    idx = [5, 0, 499, 17]
    batch = train.get_batch(idx)
    items = [train[i] for i in idx]
    for k in batch:
        want = torch.utils.data.default_collate([it[k] for it in items])
        assert batch[k].dtype == want.dtype and torch.equal(batch[k], want), k


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
