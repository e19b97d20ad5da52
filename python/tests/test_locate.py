"""dquant.locate and dquant.samples_of against the stream the plan delivers: each sample's
pieces, read from the documents, are the tokens its rank got at its step; a document's samples
are those whose pieces name it."""

import numpy as np
import pytest

import dquant
from conftest import FIXTURES

SEQ, BATCH, WORLD = 127, 2, 3


def plan(rank=0):
    return {
        "sources": [
            {"uri": str(FIXTURES / "r50k_int32"), "weight": 0.6},
            {"uri": str(FIXTURES / "r50k_int32_multiseq"), "weight": 0.4},
        ],
        "seq_len": SEQ,
        "batch_size": BATCH,
        "seed": 5,
        "samples": 1800,
        "output": "i32",
        "rank": rank,
        "world": WORLD,
    }


def documents(prefix):
    """Each document's tokens, from the .bin by the .idx's sequence lengths and document
    indices (Megatron's layout)."""
    idx = (FIXTURES / f"{prefix}.idx").read_bytes()
    n_seq, n_doc = np.frombuffer(idx[18:34], dtype="<u8")
    lengths = np.frombuffer(idx, dtype="<i4", count=n_seq, offset=34)
    doc_idx = np.frombuffer(idx, dtype="<i8", count=n_doc, offset=34 + 4 * n_seq + 8 * n_seq)
    tokens = np.fromfile(FIXTURES / f"{prefix}.bin", dtype="<i4")
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return [tokens[starts[a] : starts[b]] for a, b in zip(doc_idx[:-1], doc_idx[1:])]


def test_locate_and_samples_of_match_the_stream():
    docs = [documents("r50k_int32"), documents("r50k_int32_multiseq")]
    streams = []
    for r in range(WORLD):
        with dquant.open(plan(r), offload=False) as reader:
            streams.append(np.concatenate([b.reshape(-1) for b in reader]))
    holding = {}
    n = 1800
    for i in range(n):
        at = dquant.locate(plan(), i)
        assert (at["sample"], at["rank"], at["step"]) == (i, i % WORLD, i // WORLD // BATCH)
        got = np.concatenate(
            [docs[p["source"]][p["document"]][p["offset"] : p["offset"] + p["length"]] for p in at["pieces"]]
        )
        local = i // WORLD
        want = streams[i % WORLD][local * (SEQ + 1) : (local + 1) * (SEQ + 1)]
        assert np.array_equal(got, want), i
        for p in at["pieces"]:
            holding.setdefault((p["source"], p["document"]), []).append(i)
    for (k, d), samples in sorted(holding.items())[::5]:
        assert dquant.samples_of(plan(), k, d) == samples
        assert dquant.samples_of(plan(), k, d, range=(300, 1000)) == [s for s in samples if 300 <= s < 1000]


def test_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"^sample: 1800 is past the end of the plan: 1800 samples are delivered$"):
        dquant.locate(plan(), 1800)
    with pytest.raises(IndexError, match=r"document 28 of source 1 \(.*r50k_int32_multiseq\): it has 28 documents"):
        dquant.samples_of(plan(), 1, 28)
    with pytest.raises(ValueError, match=r"^source 2: the plan has 2 sources \(0 to 1\)$"):
        dquant.samples_of(plan(), 2, 0)
    with pytest.raises(ValueError, match=r"the start is past the end"):
        dquant.samples_of(plan(), 0, 0, range=(5, 1))


def test_provenance_in_the_batch_is_what_locate_says():
    torch = pytest.importorskip("torch")
    from dquant.torch import DataLoader, TokenDataset

    p = dict(plan(1), provenance=True, boundaries="documents", world=WORLD)
    with dquant.open(p, offload=False) as reader:
        batches = [b.base.provenance for b in reader]
    rows = []
    for step, prov in enumerate(batches):
        for sample, source, document, offset, length in prov.tolist():
            rows.append((step * BATCH + sample, source, document, offset, length))
    want = []
    for local in range(1800 // WORLD):
        at = dquant.locate(plan(), local * WORLD + 1)
        want += [(local, q["source"], q["document"], q["offset"], q["length"]) for q in at["pieces"]]
    assert rows == want
    # Through torch's DataLoader, with workers handing batches over in shared memory: 2
    # workers make rank 1 of 3 sub-ranks 2 and 3 of 6, so it reads samples i with i % 6 in
    # {2, 3}. Workers interleave batches: compare the pieces as a multiset.
    loader = DataLoader(TokenDataset(p), num_workers=2)
    got = sorted(tuple(r[1:]) for item in loader for r in item["provenance"].tolist())
    want = []
    for i in (i for i in range(1800) if i % 6 in (2, 3)):
        want += [(q["source"], q["document"], q["offset"], q["length"]) for q in dquant.locate(plan(), i)["pieces"]]
    assert got == sorted(want)
    assert dquant.open(plan(1), offload=False).__next__().base.provenance is None
