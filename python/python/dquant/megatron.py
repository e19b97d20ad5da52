"""Megatron-Core's own datasets, built by dquant: the same samples, index for index.

``build_train_valid_test_datasets`` returns what Megatron-Core's
``BlendedMegatronDatasetBuilder(GPTDataset, num_samples, ..., GPTDatasetConfig(...)).build()``
returns for the same config: three map-style datasets (or ``None`` where Megatron gives
``None``) whose ``ds[i]`` is Megatron's dict (``tokens``, ``labels``, ``loss_mask``,
``position_ids``, ``attention_mask`` when Megatron makes one, and ``dataset_id`` for a blend)
with Megatron's dtypes and shapes. So Megatron's samplers, indexing by ``consumed_samples``,
see the very samples Megatron would give them, and a job can switch loaders mid-run.

The indices (numpy ``RandomState`` shuffles, the sample index, the blending indices) are
built in Rust, in seconds, and never written to disk; ``ds.get_batch(indices)`` reads a whole
batch at once.

    >>> from dquant.megatron import build_train_valid_test_datasets
    >>> train, valid, test = build_train_valid_test_datasets(
    ...     blend=(["data/r50k_int32"], None), split="969,30,1", sequence_length=64,
    ...     random_seed=1234, num_samples=[1000, 10, 10], eod=50256)
    >>> train[0]["tokens"].shape
    torch.Size([64])

``check(...)`` compares these datasets with the installed Megatron-Core's, on your data.
"""

from __future__ import annotations

import contextlib
import os
import random as _random
import shutil
import tempfile
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy
import torch

from ._dquant import MegatronFields, megatron_agent_order, megatron_config, megatron_order

__all__ = [
    "build_train_valid_test_datasets",
    "from_megatron_args",
    "MegatronDataset",
    "check",
    "megatron_core_datasets",
]

#: Megatron-Core's pad id when the tokenizer has none (``megatron_dataset._PAD_TOKEN_ID``).
PAD_TOKEN_ID = -1

Blend = Tuple[List[str], Optional[List[float]]]


def build_train_valid_test_datasets(
    blend: Optional[Blend] = None,
    split: Optional[str] = None,
    sequence_length: Optional[int] = None,
    random_seed: Optional[int] = None,
    num_samples: Sequence[Optional[int]] = (None, None, None),
    eod: Optional[int] = None,
    reset_position_ids: bool = False,
    reset_attention_mask: bool = False,
    eod_mask_loss: bool = False,
    agent: Optional[str] = None,
    *,
    blend_per_split: Optional[Sequence[Optional[Blend]]] = None,
    config: Any = None,
    create_attention_mask: bool = True,
    add_extra_token_to_sequence: bool = True,
    mid_level_dataset_surplus: float = 0.005,
    drop_last_partial_validation_sequence: bool = True,
    pad: Optional[int] = None,
    wire_codec: str = "",
    path_to_cache: Optional[str] = None,
) -> Tuple[Optional["MegatronDataset"], Optional["MegatronDataset"], Optional["MegatronDataset"]]:
    """Megatron-Core's train, valid and test datasets for this config (each may be None).

    The arguments mean what ``GPTDatasetConfig``'s fields of the same names mean;
    ``num_samples`` is the builder's ``sizes`` (``None`` for one epoch, or an exhaustive
    blend), ``eod`` the tokenizer's end-of-document id and ``pad`` its pad id (Megatron-Core
    uses -1 when the tokenizer has none). ``config`` may be Megatron's own
    ``GPTDatasetConfig``: its fields are used and the keyword arguments above are ignored,
    but for ``num_samples`` and ``agent``.

    ``agent`` (``"dquant://HOST:PORT"`` or the agent's Unix socket path) has that agent build
    the indices next to the data, once per config however many ranks ask, and serve the
    samples by index: the prefixes are then its dataset names (``ROOT/PATH``), this process
    holds no index. Over TCP batches travel narrowed and compressed (``wire_codec``, default
    ``auto+lz4``); with the socket path they come through a shared-memory ring (default
    ``auto``: narrowed only), unless the path ends in ``?transport=tcp``. Each process (a
    DataLoader worker too) opens its own session.

    ``path_to_cache`` (or the config's) is where GPT indices are kept between opens, as
    Megatron keeps its own there (dquant's files are its own, ``*.dqmi``): an open that finds
    them reads them instead of shuffling again. None: nothing is written.
    """
    if config is not None:
        kw = _from_gpt_dataset_config(config)
    else:
        if sequence_length is None or random_seed is None:
            raise TypeError("sequence_length and random_seed are required")
        if eod is None:
            raise TypeError("eod (the tokenizer's end-of-document id) is required")
        kw = dict(
            blend=blend,
            blend_per_split=blend_per_split,
            split=split,
            sequence_length=sequence_length,
            random_seed=random_seed,
            eod=eod,
            pad=PAD_TOKEN_ID if pad is None else pad,
            reset_position_ids=reset_position_ids,
            reset_attention_mask=reset_attention_mask,
            eod_mask_loss=eod_mask_loss,
            create_attention_mask=create_attention_mask,
            add_extra_token_to_sequence=add_extra_token_to_sequence,
            mid_level_dataset_surplus=mid_level_dataset_surplus,
            drop_last_partial_validation_sequence=drop_last_partial_validation_sequence,
            path_to_cache=path_to_cache,
        )
    sizes = list(num_samples)
    if len(sizes) != 3:
        raise ValueError(f"num_samples needs 3 entries (train, valid, test), not {len(sizes)}")
    built = megatron_config(
        random_seed=int(kw["random_seed"]),
        sequence_length=int(kw["sequence_length"]),
        blend=_blend(kw["blend"]),
        blend_per_split=(
            None
            if kw["blend_per_split"] is None
            else [_blend(b) for b in kw["blend_per_split"]]
        ),
        split=kw["split"],
        num_samples=[None if n is None else int(n) for n in sizes],
        mid_level_dataset_surplus=float(kw["mid_level_dataset_surplus"]),
        add_extra_token_to_sequence=bool(kw["add_extra_token_to_sequence"]),
        drop_last_partial_validation_sequence=bool(kw["drop_last_partial_validation_sequence"]),
    )
    cache = kw.get("path_to_cache")
    if agent is None:
        order = megatron_order(built, None if cache is None else os.fspath(cache))
    else:
        order = _AgentOrder(agent, built, wire_codec)
    masks = _Masks(
        eod=int(kw["eod"]),
        pad=int(kw["pad"]),
        reset_position_ids=bool(kw["reset_position_ids"]),
        reset_attention_mask=bool(kw["reset_attention_mask"]),
        eod_mask_loss=bool(kw["eod_mask_loss"]),
        create_attention_mask=bool(kw["create_attention_mask"]),
        add_extra_token=bool(kw["add_extra_token_to_sequence"]),
    )
    return tuple(  # type: ignore[return-value]
        None if order.len(s) is None else MegatronDataset(order, s, masks) for s in range(3)
    )


def _blend(b: Optional[Blend]) -> Optional[Tuple[List[str], Optional[List[float]]]]:
    if b is None:
        return None
    prefixes, weights = b
    return (
        [str(p) for p in prefixes],
        None if weights is None else [float(w) for w in weights],
    )


def _from_gpt_dataset_config(c: Any) -> Dict[str, Any]:
    """The fields of a Megatron-Core ``GPTDatasetConfig`` this module uses."""
    if getattr(c, "mock", False):
        raise ValueError("a GPTDatasetConfig without blend or blend_per_split (mock data) is not served")
    for unsupported in ("multiple_validation_sets", "fast_cache_load", "defer_npy_index_mmap"):
        if getattr(c, unsupported, None):
            raise ValueError(f"GPTDatasetConfig.{unsupported} is not supported")
    tok = c.tokenizer
    return dict(
        blend=c.blend,
        blend_per_split=c.blend_per_split if c.blend_per_split and any(c.blend_per_split) else None,
        split=c.split,
        sequence_length=c.sequence_length,
        random_seed=c.random_seed,
        eod=tok.eod,
        pad=_pad_of(tok, getattr(c, "allow_ambiguous_pad_tokens", False)),
        reset_position_ids=c.reset_position_ids,
        reset_attention_mask=c.reset_attention_mask,
        eod_mask_loss=c.eod_mask_loss,
        create_attention_mask=c.create_attention_mask,
        add_extra_token_to_sequence=c.add_extra_token_to_sequence,
        mid_level_dataset_surplus=c.mid_level_dataset_surplus,
        drop_last_partial_validation_sequence=c.drop_last_partial_validation_sequence,
        path_to_cache=getattr(c, "path_to_cache", None),
    )


def _pad_of(tok: Any, allow_ambiguous: bool) -> int:
    """``MegatronDataset``'s pad id: the tokenizer's, unless it has none or it collides with
    another special token (then -1, as Megatron-Core decides)."""
    try:
        pad = tok.pad
    except Exception:
        return PAD_TOKEN_ID
    try:
        special = [v for k, v in tok.special_tokens_dict.items() if k != "pad_token"]
    except (AttributeError, IndexError, ValueError):
        special = []
    if not special:
        for name in ("eos", "eod"):
            try:
                special.append(getattr(tok, name))
            except (AttributeError, NotImplementedError):
                pass
    if pad in special and not allow_ambiguous:
        return PAD_TOKEN_ID
    return pad


def from_megatron_args(args: Any, num_samples: Optional[Sequence[Optional[int]]] = None) -> Dict[str, Any]:
    """Keyword arguments of ``build_train_valid_test_datasets`` from Megatron-LM's parsed
    arguments: ``--data-path`` (or ``--train/valid/test-data-path``), ``--split``,
    ``--seq-length``, ``--seed``, the masks' flags, and the sample counts from
    ``--train-samples`` or ``--train-iters`` x ``--global-batch-size`` and ``--eval-iters`` /
    ``--eval-interval`` (Megatron-LM's own rule), unless ``num_samples`` is given (pass the
    provider's ``train_val_test_num_samples``). Add ``eod=`` (the tokenizer's) and ``agent=``.
    """
    per_split = [
        _blend_from_list(getattr(args, name, None))
        for name in ("train_data_path", "valid_data_path", "test_data_path")
    ]
    blend = _blend_from_list(getattr(args, "data_path", None))
    if num_samples is None:
        num_samples = megatron_lm_num_samples(args)
    return dict(
        blend=blend,
        blend_per_split=per_split if any(b is not None for b in per_split) else None,
        split=getattr(args, "split", None) if blend is not None else None,
        sequence_length=args.seq_length,
        random_seed=args.seed,
        num_samples=list(num_samples),
        reset_position_ids=bool(getattr(args, "reset_position_ids", False)),
        reset_attention_mask=bool(getattr(args, "reset_attention_mask", False)),
        eod_mask_loss=bool(getattr(args, "eod_mask_loss", False)),
        create_attention_mask=bool(getattr(args, "create_attention_mask_in_dataloader", True)),
        mid_level_dataset_surplus=float(getattr(args, "mid_level_dataset_surplus", 0.005)),
    )


def megatron_lm_num_samples(args: Any) -> List[Optional[int]]:
    """Megatron-LM's ``train_val_test_num_samples`` from its arguments."""
    gbs = args.global_batch_size
    train_samples = getattr(args, "train_samples", None)
    if train_samples:
        train_iters = train_samples // gbs
    else:
        train_iters = args.train_iters
        train_samples = train_iters * gbs
    eval_iters = args.eval_iters
    if getattr(args, "full_validation", False):
        valid = None
    elif getattr(args, "skip_train", False):
        valid = eval_iters * gbs
    else:
        valid = (train_iters // args.eval_interval + 1) * eval_iters * gbs
    return [train_samples, valid, eval_iters * gbs]


def _blend_from_list(blend: Optional[Sequence[str]]) -> Optional[Blend]:
    """Megatron-Core's ``get_blend_from_list``: prefixes, or weight/prefix pairs."""
    if blend is None:
        return None
    blend = list(blend)
    if len(blend) % 2 == 1:
        return [p.strip() for p in blend], None
    weights: List[float] = []
    for w in blend[0::2]:
        try:
            weights.append(float(w))
        except ValueError:
            return [p.strip() for p in blend], None
    return [p.strip() for p in blend[1::2]], weights


class _Masks:
    """How ``GPTDataset.__getitem__`` makes its fields: tokens, labels, loss_mask and
    position_ids come from Rust with the rows (``MegatronFields``), the ``s x s`` attention
    mask from torch's own ops, for a whole batch at once."""

    def __init__(self, *, eod, pad, reset_position_ids, reset_attention_mask, eod_mask_loss,
                 create_attention_mask, add_extra_token):
        self.eod = eod
        self.reset_attention_mask = reset_attention_mask
        self.create_attention_mask = create_attention_mask
        self.fields = MegatronFields(
            eod=eod, pad=pad, reset_position_ids=reset_position_ids,
            eod_mask_loss=eod_mask_loss, add_extra_token_to_sequence=add_extra_token)

    def __call__(self, rows, tokens, labels, loss_mask, position_ids) -> Dict[str, torch.Tensor]:
        """Megatron's dict from what an order's ``batch`` returns."""
        out: Dict[str, torch.Tensor] = {
            "tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels)}
        if self.create_attention_mask:
            # The EODs of the tokens as read (before pads become 0).
            s = tokens.shape[1]
            out["attention_mask"] = self._attention_mask(torch.from_numpy(rows[:, :s]))
        out["loss_mask"] = torch.from_numpy(loss_mask)
        out["position_ids"] = torch.from_numpy(position_ids)
        return out

    def _attention_mask(self, tokens: torch.Tensor) -> torch.Tensor:
        n, s = tokens.shape
        allowed = torch.ones((s, s), dtype=torch.bool).tril().expand(n, s, s)
        if self.reset_attention_mask:
            # Token q sees key k only when no EOD lies in [k, q): same document.
            is_eod = tokens == self.eod
            before = torch.zeros((n, s), dtype=torch.long)
            before[:, 1:] = torch.cumsum(is_eod[:, :-1], dim=1)
            allowed = allowed & (before[:, :, None] == before[:, None, :])
        return (~allowed).unsqueeze(1).contiguous()


class _AgentOrder:
    """An agent's build of one config, opened once per process.

    A DataLoader worker, forked or spawned, cannot use its parent's session: it opens its own
    on first use, and the agent finds the config already built."""

    def __init__(self, agent: str, config: str, wire_codec: str):
        self._args = (agent, config, wire_codec)
        self._pid: Optional[int] = None
        self._order = None
        self._get()  # open now, so a bad config or an unreachable agent fails here

    def _get(self):
        if self._pid != os.getpid():
            self._order = megatron_agent_order(*self._args)
            self._pid = os.getpid()
        return self._order

    def __getstate__(self):
        return {"_args": self._args, "_pid": None, "_order": None}

    def __getattr__(self, name: str):
        # len, is_blended, sample_tokens, batch, pieces, sources, was_cached
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get(), name)


class MegatronDataset(torch.utils.data.Dataset):
    """One split of Megatron-Core's sample order: ``GPTDataset`` or ``BlendedDataset``."""

    def __init__(self, order, split: int, masks: _Masks):
        self._order = order
        self._split = split
        self._masks = masks
        self._len = order.len(split)
        self._blended = order.is_blended(split)
        self.index_split = ("train", "valid", "test")[split]

    def __len__(self) -> int:
        return self._len

    def _index(self, idx: int) -> int:
        i = int(idx)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"index {idx} is out of bounds for a dataset of {self._len} samples")
        return i

    def __getitem__(self, idx: Optional[int]) -> Dict[str, Any]:
        if idx is None and not self._blended:
            # Megatron's batch-padding sample: sample 0 with its loss masked out.
            item = self._items([0], None)
            item["loss_mask"] = torch.zeros_like(item["loss_mask"])
            return item
        return self._items([self._index(idx)], None)

    def __getitems__(self, indices: Sequence[Optional[int]]) -> List[Dict[str, Any]]:
        """The samples a DataLoader's batch sampler asks for, read in one go (one round trip
        to an agent), as the list of dicts its collate function stacks."""
        if any(i is None for i in indices):
            return [self[i] for i in indices]
        b = self._items([self._index(i) for i in indices], len(indices))
        ids = b.pop("dataset_id", None)
        items = [{k: v[n] for k, v in b.items()} for n in range(len(indices))]
        if ids is not None:
            items = [{"dataset_id": numpy.int16(ids[n]), **it} for n, it in enumerate(items)]
        return items

    def get_batch(self, indices: Sequence[int]) -> Dict[str, torch.Tensor]:
        """Samples ``indices`` in one read, stacked as ``default_collate`` stacks
        Megatron's dicts (``attention_mask`` is ``(n, 1, s, s)``)."""
        return self._items([self._index(i) for i in indices], len(indices))

    def _items(self, indices: List[int], batch: Optional[int]) -> Dict[str, Any]:
        *arrays, ids = self._order.batch(self._split, indices, self._masks.fields)
        out = self._masks(*arrays)
        if batch is None:
            out = {k: v[0] for k, v in out.items()}
            if ids is not None:
                return {"dataset_id": numpy.int16(ids[0]), **out}
            return out
        if ids is not None:
            return {"dataset_id": torch.tensor(ids, dtype=torch.int16), **out}
        return out

    def pieces(self, idx: int):
        """What sample ``idx`` is made of: ``(dataset_id, [(prefix, sequence, offset,
        length), ...], pad)``, the sequences (documents) of Megatron's indexed datasets."""
        return self._order.pieces(self._split, self._index(idx))

    def samples_of(self, source, sequence: int) -> List[int]:
        """Every sample index of this dataset holding a token of sequence (document)
        ``sequence`` of ``source`` (a prefix as the config names it, or its index in the
        build's sources), ascending: ``pieces`` the other way. Megatron's index arrays are
        inverted once, on the first call."""
        names = self._order.sources()
        k = names.index(source) if isinstance(source, str) else int(source)
        return self._order.samples_of(self._split, k, int(sequence))


def check(
    samples: Optional[int] = 200,
    seed: int = 0,
    num_samples: Sequence[Optional[int]] = (None, None, None),
    config: Any = None,
    **kwargs: Any,
) -> str:
    """Compares dquant with the installed Megatron-Core on this config, at ``samples`` distinct
    random indices of every split and its first and last (``samples=None``: every index, in
    order): returns ``"identical"`` or raises ``AssertionError`` naming the first difference. The config is a ``GPTDatasetConfig`` or
    ``build_train_valid_test_datasets``'s keyword arguments (then ``eod`` is required).
    """
    if config is None:
        config = _gpt_dataset_config(**kwargs)
    ours = build_train_valid_test_datasets(config=config, num_samples=num_samples)
    theirs = megatron_core_datasets(config, num_samples)
    compare_splits(ours, theirs, samples, seed)
    return "identical"


def compare_splits(ours, theirs, samples: Optional[int] = 200, seed: int = 0) -> List[Optional[int]]:
    """Compares two ``(train, valid, test)`` triples (dquant's, Megatron-Core's) at
    ``samples`` distinct random indices of every split and its first and last, or, with
    ``samples=None`` (or a split no larger than ``samples``), at every index in order; raises
    ``AssertionError`` naming the first difference. Returns how many indices each split
    compared (``None`` for a split neither side has)."""
    rng = _random.Random(seed)
    compared: List[Optional[int]] = []
    for name, a, b in zip(("train", "valid", "test"), ours, theirs):
        if (a is None) != (b is None):
            raise AssertionError(f"{name}: dquant gives {a!r}, Megatron-Core {b!r}")
        if a is None:
            compared.append(None)
            continue
        if len(a) != len(b):
            raise AssertionError(f"{name}: dquant has {len(a)} samples, Megatron-Core {len(b)}")
        picks = _picks(len(a), samples, rng)
        for i in picks:
            _compare_items(f"{name}[{i}]", a[i], b[i])
        compared.append(len(picks))
    return compared


def _picks(n: int, samples: Optional[int], rng: "_random.Random") -> List[int]:
    """The indices of an ``n``-sample split that a comparison reads, in order: all of them
    when ``samples`` is None or covers the split, else the first, the last and ``samples``
    distinct others drawn by ``rng``."""
    if samples is None or n <= samples + 2:
        return list(range(n))
    inner = rng.sample(range(1, n - 1), samples)
    return [0, *sorted(inner), n - 1]


def megatron_core_datasets(config: Any, num_samples: Sequence[Optional[int]]):
    """The installed Megatron-Core's own datasets for ``config`` (a ``GPTDatasetConfig``):
    ``BlendedMegatronDatasetBuilder(GPTDataset, num_samples, ...).build()``."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset

    with _process_group():
        return BlendedMegatronDatasetBuilder(
            GPTDataset, list(num_samples), lambda: True, config
        ).build()


@contextlib.contextmanager
def _process_group():
    """A one-process gloo group while Megatron-Core builds, unless one exists: its
    ``BlendedDataset`` asks for the rank whenever it has a cache directory."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _compare_items(where: str, ours: Dict[str, Any], theirs: Dict[str, Any]) -> None:
    if list(ours) != list(theirs):
        raise AssertionError(f"{where}: keys {list(ours)} != Megatron-Core's {list(theirs)}")
    for k, v in theirs.items():
        o = ours[k]
        if isinstance(v, torch.Tensor):
            if o.dtype != v.dtype or o.shape != v.shape:
                raise AssertionError(
                    f"{where}[{k!r}]: {o.dtype} {tuple(o.shape)} != Megatron-Core's {v.dtype} {tuple(v.shape)}"
                )
            if not torch.equal(o, v):
                at = (o != v).nonzero()[0].tolist()
                raise AssertionError(
                    f"{where}[{k!r}] differs first at {at}: {o[tuple(at)].item()} != {v[tuple(at)].item()}"
                )
        elif type(o) is not type(v) or o != v:
            raise AssertionError(f"{where}[{k!r}]: {o!r} != Megatron-Core's {v!r}")


class _Tokenizer:
    """The little of a Megatron tokenizer the datasets use: eod, and no pad."""

    def __init__(self, eod: int, vocab_size: Optional[int] = None):
        self.eod = eod
        self.vocab_size = vocab_size
        self.unique_identifiers = {"class": "dquant.megatron._Tokenizer", "eod": eod}


def _gpt_dataset_config(*, eod: int, blend=None, blend_per_split=None, split=None,
                        sequence_length: int, random_seed: int, path_to_cache=None, **rest):
    """A ``GPTDatasetConfig``; Megatron's index cache goes to a fresh temporary directory
    unless ``path_to_cache`` names one (without one, Megatron writes beside the data). The
    temporary directory is removed when the config is collected (datasets built from it hold
    it) or at exit."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    made = None
    if path_to_cache is None:
        path_to_cache = made = tempfile.mkdtemp(prefix="dquant-megatron-check-")

    rest.setdefault("reset_position_ids", False)
    rest.setdefault("reset_attention_mask", False)
    rest.setdefault("eod_mask_loss", False)
    config = GPTDatasetConfig(
        random_seed=random_seed,
        sequence_length=sequence_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=split,
        tokenizer=_Tokenizer(eod),
        path_to_cache=path_to_cache,
        **rest,
    )
    if made is not None:
        weakref.finalize(config, shutil.rmtree, made, ignore_errors=True)
    return config


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m dquant.megatron``: the trust tool, with Megatron-LM's own flags."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m dquant.megatron",
        description="Compare dquant's Megatron-order datasets with the installed Megatron-Core "
        "on your data and config, at random indices of every split. Prints 'identical' or the "
        "first difference (exit status 1).",
        epilog="example: python -m dquant.megatron --data-path 30 data/a 70 data/b "
        "--split 969,30,1 --seq-length 4096 --seed 1234 --train-iters 1000 "
        "--global-batch-size 256 --eval-iters 10 --eval-interval 500 --eod 50256",
    )
    p.add_argument("--data-path", nargs="+", help="prefixes, or weight prefix pairs (as Megatron-LM)")
    for name in ("train", "valid", "test"):
        p.add_argument(f"--{name}-data-path", nargs="+")
    p.add_argument("--split", default="969,30,1")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--train-samples", type=int)
    p.add_argument("--train-iters", type=int)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--eval-iters", type=int, default=100)
    p.add_argument("--eval-interval", type=int, default=1000)
    p.add_argument("--eod", type=int, required=True, help="the tokenizer's end-of-document id")
    p.add_argument("--reset-position-ids", action="store_true")
    p.add_argument("--reset-attention-mask", action="store_true")
    p.add_argument("--eod-mask-loss", action="store_true")
    p.add_argument("--mid-level-dataset-surplus", type=float, default=0.005)
    p.add_argument("--samples", type=int, default=200,
                   help="distinct random indices per split, besides its first and last [200]")
    p.add_argument("--every-index", action="store_true",
                   help="compare every index of every split, in order (slow on large splits)")
    args = p.parse_args(argv)
    if args.train_samples is None and args.train_iters is None:
        p.error("give --train-samples or --train-iters")
    args.create_attention_mask_in_dataloader = True
    kw = from_megatron_args(args)
    num_samples = kw.pop("num_samples")
    print(f"config: {kw}\nnum_samples: {num_samples}", flush=True)
    try:
        print(check(samples=None if args.every_index else args.samples, num_samples=num_samples, eod=args.eod, **kw))
    except AssertionError as e:
        print(f"different: {e}")
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
