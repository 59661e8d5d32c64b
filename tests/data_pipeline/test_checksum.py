"""The fast CRC-32 is zlib's: everything written with zlib's (checkpoints, dataset columns, raw-file
identities) verifies unchanged. And the fast checks of a dataset column agree with the plain ones."""

import zlib

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_pipeline.npy_stream import data_crc32, first_id_outside
from dlrm.checkpoints import format as ckpt
from hybrid_dlrm.common import crc as checksum
from hybrid_dlrm.common.crc import crc32


def test_the_fast_implementation_is_installed():
    # the pinned `isal` package; without it zlib computes the same values 7x slower
    assert crc32.__module__ == "isal.isal_zlib"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=5000), start=st.integers(0, 2**32 - 1), cut=st.integers(0, 64))
def test_same_values_as_zlib_for_any_bytes_start_and_split(data, start, cut):
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)
    head, tail = data[:cut], data[cut:]  # chained over pieces, as files are read
    assert crc32(tail, crc32(head)) == zlib.crc32(data)


def test_same_values_on_large_unaligned_numpy_views():
    buf = np.random.default_rng(1).integers(0, 256, (1 << 22) + 13, dtype=np.uint8)
    for lo, hi in [(0, len(buf)), (3, len(buf) - 5), (1 << 20, (1 << 21) + 7)]:
        view = buf[lo:hi]
        assert crc32(view) == zlib.crc32(view)


def test_a_checkpoint_summed_with_zlib_verifies_with_the_fast_crc(tmp_path, monkeypatch):
    obj = {
        "format": ckpt.FORMAT,
        "version": ckpt.VERSION,
        "model": {"w": torch.randn(1000, 7), "b": torch.arange(5)},
    }
    path = tmp_path / "zlib.pt"
    monkeypatch.setattr(ckpt, "crc32", zlib.crc32)  # as files were written before isal
    ckpt.save(obj, path)
    monkeypatch.setattr(ckpt, "crc32", checksum.crc32)
    loaded = ckpt.load(path)
    assert torch.equal(loaded["model"]["w"], obj["model"]["w"])


def test_data_crc32_is_zlibs_over_the_data_bytes(tmp_path):
    for shape in [(0, 26), (1,), (1000, 26), (70_001, 3)]:
        arr = np.random.default_rng(2).integers(-5, 5, shape, dtype=np.int32)
        path = tmp_path / "a.npy"
        np.save(path, arr)
        assert data_crc32(path, chunk_bytes=4096) == zlib.crc32(arr.tobytes())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(0, 300),
    cols=st.integers(1, 5),
    dtype=st.sampled_from([np.int32, np.int64]),
    seed=st.integers(0, 2**16),
    bad=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["neg", "at", "above"])), max_size=3),
)
def test_first_id_outside_matches_the_reference(rows, cols, dtype, seed, bad):
    rng = np.random.default_rng(seed)
    limits = rng.integers(1, 50, cols)
    ids = (rng.random((rows, cols)) * limits).astype(dtype)
    for where, kind in bad:
        if rows:
            r, c = int(where * (rows - 1)), int(where * 7919) % cols
            ids[r, c] = {"neg": -1, "at": limits[c], "above": np.iinfo(dtype).max}[kind]
    reference = np.argwhere((ids < 0) | (ids >= limits))
    expected = tuple(int(x) for x in reference[0]) if len(reference) else None
    # chunks of a few rows: the first bad id may sit in any chunk
    assert first_id_outside(ids, limits, chunk_bytes=3 * cols * ids.itemsize) == expected
    if cols == 1:  # one limit for all, on a 1-d column (Taobao's users)
        assert first_id_outside(ids[:, 0], int(limits[0]), chunk_bytes=16) == expected
