"""Multi-hot bags against the memory, before anything of their size is allocated (issue 46).

A bag size is a number a user types (`--multi-hot-sizes 1000000`), and every structure made
from it grows with it: a synthetic chunk of 8192 samples, a materialisation block of 65536, a
training batch. Counted here by arithmetic, so a size that cannot fit is one line naming the
flag, what it needs and what this process may use (hybrid_dlrm/common/host_memory.py), never a
numpy allocation of terabytes or minutes of a Python loop over the ids first.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybrid_dlrm.common.host_memory import fmt_bytes, host_room

from .errors import DataError

SPEC_BYTES_PER_ID = 32  # a BagSpec's table, column and two hash keys per id of a sample's bags


def bag_bytes(sizes: Sequence[int], rows: int, itemsize: int = 8) -> int:
    """The bags of `rows` samples, plus the spec that makes them."""
    ids = sum(int(k) for k in sizes)
    return rows * ids * itemsize + ids * SPEC_BYTES_PER_ID


def check_bags(
    flag: str, sizes: Sequence[int], rows: int, what: str, limit: int | None = None,
    itemsize: int = 8,
) -> None:  # fmt: skip
    """DataError (one line) when the bags of `rows` samples (`what` they are) do not fit in the
    host memory this process may use (`limit`: `--memory-limit`, or None)."""
    need = bag_bytes(sizes, rows, itemsize)
    room = host_room(limit)
    if room is None or need <= room.bytes:
        return
    ids = sum(int(k) for k in sizes)
    raise DataError(
        f"{flag}: bags of {ids:,} ids per sample need {fmt_bytes(need)} for {what} ({rows:,} "
        f"samples) but this process may use {fmt_bytes(room.bytes)} ({room.source}); use "
        "smaller bags"
    )
