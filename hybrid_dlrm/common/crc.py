"""The checksum of every file we write: CRC-32 (zlib's polynomial and values), at memory speed.

`crc32(data, value=0)` is `zlib.crc32`'s function, computed by ISA-L (the `isal` package), which
folds 64+ bytes per instruction with carry-less multiplication (PCLMULQDQ/VPCLMULQDQ) where
zlib's table-driven loop takes a byte or a word at a time: on a 2-core AMD EPYC, 30 GB/s
against zlib's 4.2 (scripts/bench_checksums.py, docs/training.md). The values are zlib's, so every
checksum written before (checkpoint manifests, dataset column CRCs, raw-file edge CRCs, the SSD
tier's block trailers and journal) verifies unchanged and no file format had to change. Both
release the GIL on large buffers.

CRC-32 rather than a cryptographic hash: the threat is damage (disks, copies, half-written files),
not forgery (a forger can write any file; what protects from code in it is loading without
pickle). CRC-32 catches every burst of damage up to 32 bits long and lets other damage through
with odds of 2^-32 per checked chunk. XXH3 (the `xxhash` package) hashed at about the same speed
here but has no such guarantee and would have meant new formats; CRC-32C (`crc32c`,
`google-crc32c`) ran at 14-17 GB/s. Where `isal` has no wheel, zlib computes the same values.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without isal's wheels: same values, slower
    from zlib import crc32

__all__ = ["crc32", "crc32_rows", "crc_hex", "file_crc32"]


def crc_hex(data, value: int = 0) -> str:
    """The CRC-32 as the 8 hex digits the JSON manifests store."""
    return f"{crc32(data, value):08x}"


def file_crc32(path: str | Path, offset: int = 0, chunk_bytes: int = 1 << 24) -> int:
    """CRC-32 of a file's bytes from `offset` on, read through a memory map: 0.06 s per GB from
    the page cache against 0.21 through read() copies (docs/data.md)."""
    if os.path.getsize(path) <= offset:
        return 0
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset)
    crc = 0
    for start in range(0, len(data), chunk_bytes):
        crc = crc32(data[start : start + chunk_bytes], crc)
    return crc


_rows_kernel = None  # compiled on first use (numba and ISA-L's C function), or False


def _compile_rows():
    """A loop over rows calling ISA-L's `crc32_gzip_refl` (the C function behind `crc32`, exported
    by isal's extension module) from compiled code: 0.15 us a 4 KiB block where a Python loop
    over `crc32` took 1.2 (the SSD tier checks and seals thousands of blocks a step)."""
    import ctypes

    import numba
    from isal import isal_zlib

    fn = ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl
    fn.restype = ctypes.c_uint32
    fn.argtypes = [ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64]  # the pointer as an integer

    @numba.njit(nogil=True)
    def rows(ptr, n, stride, nbytes, out):
        for i in range(n):
            out[i] = fn(0, ptr + i * stride, nbytes)

    return rows


def crc32_rows(rows: np.ndarray, nbytes: int) -> np.ndarray:
    """uint32 CRC-32 (`crc32`'s values) of the first `nbytes` bytes of each row of a uint8
    [n, width] array whose rows are each contiguous."""
    global _rows_kernel
    n = rows.shape[0]
    out = np.empty(n, dtype=np.uint32)
    if n and rows.strides[1] == 1 and nbytes <= rows.shape[1]:
        if _rows_kernel is None:
            try:
                _rows_kernel = _compile_rows()
            except (ImportError, OSError, AttributeError):  # no isal here: zlib's, row by row
                _rows_kernel = False
        if _rows_kernel:
            _rows_kernel(rows.ctypes.data, n, rows.strides[0], nbytes, out)
            return out
    for i in range(n):
        out[i] = crc32(rows[i, :nbytes])
    return out
