"""`dquant mount` read by unmodified Megatron-Core and numpy: the mount is a real FUSE file
system (a `dquant mount` process) over a real agent, and what they read is compared with the
fixtures Megatron wrote and with a local `dquant convert`.

Needs /dev/fuse and root: without them every test fails under CI=true (CI has both) and is
skipped, with the reason, elsewhere."""

import contextlib
import gc
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, Agent, dquant_bin, require


@pytest.fixture(autouse=True)
def _fuse() -> None:
    fuse, root = os.path.exists("/dev/fuse"), os.geteuid() == 0
    require("FUSE", fuse and root, f"dquant mount needs /dev/fuse and root; have /dev/fuse: {fuse}, root: {root}")

NAMES = ("r50k_int32", "r50k_uint16", "r50k_int32_multiseq")


def is_mounted(path: Path) -> bool:
    path = str(path.resolve())
    with open("/proc/self/mountinfo") as f:
        return any(
            line.split(" ")[4] == path and " - fuse dquant:" in line for line in f
        )


@contextlib.contextmanager
def mounted(agent_uri: str, mnt: Path, *args: str):
    """A `dquant mount` process on `mnt`, unmounted by SIGTERM at the end."""
    mnt.mkdir(parents=True, exist_ok=True)
    log = mnt.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(dquant_bin()), "mount", agent_uri, str(mnt), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dquant mount did not mount: {log.read_text()}")
            time.sleep(0.02)
        yield mnt
    finally:
        gc.collect()  # the datasets' memmaps of the mount
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(10) == 0, log.read_text()
        except subprocess.TimeoutExpired:
            # A file of the mount is still mapped here (Megatron keeps its datasets in
            # caches): the mount was detached and serves it until it closes.
            assert "detaching" in log.read_text(), log.read_text()
            proc.kill()
            proc.wait()
        assert not is_mounted(mnt)


@pytest.fixture(scope="module")
def mount(tmp_path_factory):
    """The three Megatron fixtures on an agent (root `data`), mounted with --dtype auto."""
    root = tmp_path_factory.mktemp("fixtures")
    for name in NAMES:
        for ext in ("bin", "idx"):
            shutil.copy(FIXTURES / f"{name}.{ext}", root / f"{name}.{ext}")
    tmp = tmp_path_factory.mktemp("mount")
    agent = Agent(root, tmp / "agent.sock")
    try:
        with mounted(agent.uri, tmp / "mnt") as mnt:
            yield mnt / "data"
    finally:
        agent.stop()


def test_megatron_indexed_dataset_reads_int32_as_uint16(mount):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    for name in ("r50k_int32", "r50k_int32_multiseq"):
        local = IndexedDataset(str(FIXTURES / name))
        remote = IndexedDataset(str(mount / name))
        assert local.index.dtype == np.int32
        assert remote.index.dtype == np.uint16
        assert len(remote) == len(local)
        np.testing.assert_array_equal(remote.sequence_lengths, local.sequence_lengths)
        np.testing.assert_array_equal(remote.document_indices, local.document_indices)
        np.testing.assert_array_equal(remote.index.sequence_pointers, local.index.sequence_pointers // 2)
        for i in range(len(local)):
            got = remote[i]
            assert got.dtype == np.uint16
            np.testing.assert_array_equal(got, local[i])
        # Partial reads, as GPTDataset makes them.
        for i in range(0, len(local), 3):
            n = int(local.sequence_lengths[i])
            off, length = n // 3, max(1, n // 2)
            np.testing.assert_array_equal(
                remote.get(i, offset=off, length=length), local.get(i, offset=off, length=length)
            )


def test_np_memmap_equals_a_local_convert_byte_for_byte(mount, tmp_path):
    for name in NAMES:
        dst = tmp_path / f"{name}_u16"
        subprocess.run(
            [str(dquant_bin()), "convert", str(FIXTURES / name), str(dst), "--codec", "u16", "-q"],
            check=True,
        )
        got = np.memmap(mount / f"{name}.bin", dtype=np.uint16, mode="r")
        want = np.memmap(f"{dst}.bin", dtype=np.uint16, mode="r")
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert (mount / f"{name}.idx").read_bytes() == Path(f"{dst}.idx").read_bytes()
    # Megatron's own uint16 files, byte for byte.
    assert (mount / "r50k_int32.bin").read_bytes() == (FIXTURES / "r50k_uint16.bin").read_bytes()
    assert (mount / "r50k_int32.idx").read_bytes() == (FIXTURES / "r50k_uint16.idx").read_bytes()


def test_gpt_dataset_over_the_mount_equals_over_local_files(mount, tmp_path):
    """Megatron's GPTDataset (its own index building, memmap sampling) gives the same samples
    over the mount as over a local uint16 copy."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tok:
        """What GPTDatasetConfig needs of a tokenizer; vocab_size None: the .idx's dtype."""

        eod = 50256
        vocab_size = None
        unique_identifiers = {"class": "dquant-mount-test"}

    local = tmp_path / "local"
    local.mkdir()
    for ext in ("bin", "idx"):
        shutil.copy(FIXTURES / f"r50k_uint16.{ext}", local / f"r50k_int32.{ext}")

    def samples(prefix: Path) -> list:
        cfg = GPTDatasetConfig(
            random_seed=1234,
            sequence_length=128,
            blend=([str(prefix)], None),
            split="100,0,0",
            path_to_cache=str(tmp_path / f"cache-{prefix.parent.name}"),
            tokenizer=Tok(),
            mmap_bin_files=True,
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
        )
        train, _, _ = BlendedMegatronDatasetBuilder(
            GPTDataset, [200, None, None], lambda: True, cfg
        ).build()
        return [train[i]["tokens"].numpy() for i in range(len(train))]

    want = samples(local / "r50k_int32")
    got = samples(mount / "r50k_int32")
    assert len(got) == len(want) >= 200
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
