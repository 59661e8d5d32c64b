"""`crc32_rows`: many rows' CRC-32 in one call (the SSD tier's 4 KiB blocks) equal to `crc32` of
each row, through ISA-L's C function from compiled code and through the row-by-row fallback."""

import zlib

import numpy as np
import pytest

from hybrid_dlrm.common import crc


@pytest.mark.parametrize("compiled", [True, False])
def test_crc32_rows_equals_the_crc_of_each_row(monkeypatch, compiled):
    if not compiled:
        monkeypatch.setattr(crc, "_rows_kernel", False)  # as where isal has no wheel
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, (300, 4096), dtype=np.uint8)
    got = crc.crc32_rows(blocks, 4092)
    assert got.dtype == np.uint32 and got.shape == (300,)
    assert got.tolist() == [zlib.crc32(blocks[i, :4092].tobytes()) for i in range(300)]
    part = blocks[17:41]  # rows of a larger array: its own start, the whole array's stride
    assert crc.crc32_rows(part, 100).tolist() == [zlib.crc32(r[:100].tobytes()) for r in part]
    assert crc.crc32_rows(blocks[:0], 4092).size == 0
    if compiled:
        assert crc._rows_kernel  # the compiled path was taken on this machine (isal installed)
