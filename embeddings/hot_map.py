"""Which rows the device tier holds, and where: global row id -> its slot in its device-tier table.

Hotline (and the SSD tier built on it) maps every lookup of every step through this map. The hot
rows are `hot_gids` (sorted global ids); a hot row's slot in its table is its rank among the
table's hot rows, so `hot_gids` alone answers the question. What the map adds is speed:

- **dense**: an int32 array over every row of every table (-1 = cold). One load per lookup,
  but 4 bytes for each row: 1.04 GB for the Terabyte recipe's 260M rows, whatever the hot set.
- **hashed**: an open-addressing table (linear probing, load <= 1/2) of int32 positions into
  `hot_gids`: 4 bytes per slot, 2-4 slots per hot row (128 MB for 16M hot rows).

Chosen by measured cost per mini-batch (`python scripts/bench_hot_map.py`, figures in
docs/scm.md): the hashed map costs a few ms more than the dense one per Terabyte mini-batch,
binary search in `hot_gids` about twice as much. The dense form stays where the tables are small
(at most `DENSE_MAX_ROWS` rows: <= 256 MB) or the hot set is over 1/16 of the rows; above that
the hashed form is used.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

DENSE_MAX_ROWS = 1 << 26  # a dense map of at most 256 MB is kept: the fastest lookups
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier


@numba.njit(cache=True)
def _build(keys, table, shift):
    mask = table.size - 1
    for i in range(keys.size):
        j = np.int64((np.uint64(keys[i]) * _GOLDEN) >> shift) & mask
        while table[j] >= 0:
            j = (j + 1) & mask
        table[j] = i


@numba.njit(cache=True, inline="always")
def hashed_position(keys, table, shift, gid):
    """The position of `gid` in the sorted `keys`, -1 when absent (numba)."""
    mask = table.size - 1
    j = np.int64((np.uint64(gid) * _GOLDEN) >> shift) & mask
    while True:
        k = table[j]
        if k < 0:
            return -1
        if keys[k] == gid:
            return k
        j = (j + 1) & mask


@numba.njit(cache=True, nogil=True)
def _slots(gids, dense, keys, table, shift, first, table_of_key):
    out = np.empty(gids.size, np.int64)
    for i in range(gids.size):
        g = gids[i]
        if dense.size:
            out[i] = dense[g]
        else:
            k = hashed_position(keys, table, shift, g)
            out[i] = -1 if k < 0 else k - first[table_of_key[k]]
    return out


def use_dense(total_rows: int, hot_rows: int) -> bool:
    """Dense for small tables, or when the hashed form would save less than 3/4 of the bytes."""
    return total_rows <= DENSE_MAX_ROWS or 4 * hot_rows * 4 > total_rows


class HotRowMap:
    """Global row -> slot in its device-tier table (-1: cold), for sorted unique `hot_gids`."""

    def __init__(
        self,
        hot_gids: torch.Tensor,
        row_base: torch.Tensor,
        total_rows: int,
        dense: bool | None = None,
    ) -> None:
        self.hot_gids = hot_gids  # int64, sorted
        self.row_base = row_base
        T = row_base.numel()
        table = torch.bucketize(hot_gids, row_base, right=True) - 1
        self.n_hot = torch.bincount(table, minlength=T)
        self.first = torch.zeros(T + 1, dtype=torch.int64)  # first hot position of each table
        self.first[1:] = torch.cumsum(self.n_hot, 0)
        n = hot_gids.numel()
        self.dense = use_dense(total_rows, n) if dense is None else dense
        self._keys = hot_gids.numpy()
        self._first = self.first.numpy()
        self._table_of_key = table.to(torch.int16 if T < 2**15 else torch.int32).numpy()
        if self.dense:
            remap = np.full(total_rows, -1, dtype=np.int32)  # hot rows < 2**31
            remap[self._keys] = (np.arange(n) - self._first[table.numpy()]).astype(np.int32)
            self._dense, self._table, self._shift = remap, np.zeros(1, np.int32), np.uint64(0)
        else:
            bits = max(1, int(np.ceil(np.log2(max(2 * n, 2)))))
            self._table = np.full(1 << bits, -1, dtype=np.int32)
            self._shift = np.uint64(64 - bits)
            _build(self._keys, self._table, self._shift)
            self._dense = np.zeros(0, np.int32)

    def numba_args(self) -> tuple:
        """(dense, keys, table, shift, first, table_of_key): what a numba loop needs to map."""
        return (
            self._dense, self._keys, self._table, self._shift, self._first, self._table_of_key
        )  # fmt: skip

    def slots(self, gids: torch.Tensor) -> torch.Tensor:
        """int64 per global id: its slot in its device-tier table, -1 when cold."""
        g = gids.long().contiguous().numpy()
        return torch.from_numpy(_slots(g, *self.numba_args()))

    def table_hot(self, t: int) -> torch.Tensor:
        """Table t's hot rows (row ids within the table, ascending = slot order)."""
        a, b = int(self.first[t]), int(self.first[t + 1])
        return self.hot_gids[a:b] - self.row_base[t]

    def nbytes(self) -> int:
        """The map's own bytes (the dense array or the hash table with its lookup aids)."""
        return self._dense.nbytes + self._table.nbytes + self._table_of_key.nbytes
