"""The fast CRC-32 is zlib's: everything written with zlib's (checkpoints, dataset columns, raw-file
identities) verifies unchanged."""

import zlib

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data_pipeline import checksum
from data_pipeline.checksum import crc32
from dlrm import checkpoint as ckpt


def test_the_fast_implementation_is_installed():
    # the pinned `isal` package; without it zlib computes the same values 7x slower
    assert crc32.__module__ == "isal.isal_zlib"


@settings(max_examples=200, deadline=None)
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
