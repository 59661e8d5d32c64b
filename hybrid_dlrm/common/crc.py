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

__all__ = ["crc32", "crc_hex", "file_crc32"]


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
