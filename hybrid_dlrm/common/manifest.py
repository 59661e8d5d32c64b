"""The one checksum manifest: per file, its size and a digest, made when the file is written and
checked when it is read, so a truncated, replaced or damaged file is named, never loaded.

A record is `{"bytes": N, ALGORITHM: DIGEST}` (plus whatever the format keeps beside it: a
dataset column's row count, an artifact tensor's dtype and shape). ALGORITHM is "crc32" (an
int, of the bytes from `offset` on: a `.npy` column's data after its header) or "sha256" (hex,
of the whole file: inference artifacts, which are handed to other people). A small JSON record
that checks itself (a sharded checkpoint's index) is `seal`ed: its body and the CRC-32 of the
body's canonical JSON.

Checkpoints carry their manifest inside the file (dlrm/checkpoints/format.py: per tensor, per 16 MiB);
plans and profiles are `.npz` files whose every member zip's CRC-32 covers.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hybrid_dlrm.common.crc import crc_hex, file_crc32

__all__ = ["ALGORITHMS", "Damaged", "digests", "file_digest", "file_record", "record_problem", "seal",
           "sha256_file", "unseal"]  # fmt: skip

ALGORITHMS = ("crc32", "sha256")
_HASH_BLOCK = 8 << 20
_THREADS = min(8, os.cpu_count() or 1)


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str | Path, algorithm: str = "crc32", offset: int = 0) -> int | str:
    if algorithm == "crc32":
        return file_crc32(path, offset)
    if algorithm == "sha256" and offset == 0:
        return sha256_file(path)
    raise ValueError(f"unknown file digest {algorithm!r} (offset {offset})")


def digests(paths: Iterable[str | Path], algorithm: str = "crc32") -> list[int | str]:
    """The digests of many files, several at a time (both digests release the GIL)."""
    with ThreadPoolExecutor(_THREADS) as pool:
        return list(pool.map(lambda p: file_digest(p, algorithm), paths))


def file_record(path: str | Path, algorithm: str = "crc32", offset: int = 0) -> dict[str, Any]:
    return {"bytes": Path(path).stat().st_size, algorithm: file_digest(path, algorithm, offset)}


def record_problem(
    path: str | Path,
    record: dict,
    algorithm: str = "crc32",
    offset: int = 0,
    full: bool = True,
    source: str = "manifest",
) -> str | None:
    """Why `path` does not match its record (its size; with `full` also its digest), or None.
    Words only (`source`: what holds the record): the caller names the file in its own error."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if size != record.get("bytes"):
        return f"{size} bytes, the {source} says {record.get('bytes')}"
    if full and file_digest(path, algorithm, offset) != record.get(algorithm):
        return f"checksum differs from its {source}"
    return None


class Damaged(ValueError):
    """A sealed record whose body does not match its CRC-32."""


def seal(body: dict) -> dict:
    """A JSON record that checks itself: the body and the CRC-32 of its canonical JSON."""
    return {"body": body, "crc32": crc_hex(json.dumps(body, sort_keys=True).encode())}


def unseal(record: Any) -> dict:
    """The body of a sealed record; `Damaged` when it does not match its CRC-32, KeyError or
    TypeError when it is not a sealed record at all."""
    body = record["body"]
    if record["crc32"] != crc_hex(json.dumps(body, sort_keys=True).encode()):
        raise Damaged("its contents do not match their checksum")
    return body
