"""Initial embedding rows as a pure function of (seed, table, row): `hashed` initialisation.

The in-memory collections draw each table from one seeded generator (`fused.uniform_table`):
row r's values depend on every row before it, so a tier that stores only the rows it touched
(the SSD tier, whose tables may be larger than memory and than the free disk) cannot compute
them. `hashed_rows` gives any row its values directly, with the same distribution,
U(-sqrt(1/rows), +sqrt(1/rows)), from a counter-based hash (murmur3's 32-bit finaliser of seed,
table, row and column; 24 random bits per value).

`--placement tiered` always initialises this way; `--embedding-init hashed` makes the device
placement start from exactly the same values (what the equivalence tests compare).
"""

from __future__ import annotations

import numpy as np
import torch

_CHUNK_ROWS = 1 << 18  # rows per vectorised chunk when a whole table is made


def _fmix32(h: np.ndarray) -> np.ndarray:
    """murmur3's finaliser on uint32 arrays (in place; wraps modulo 2**32)."""
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _table_key(seed: int, table: np.ndarray) -> np.ndarray:
    """One uint32 key per (seed, table)."""
    t = np.asarray(table, dtype=np.int64)
    k = ((seed * 1_000_003 + t * 7919 + 1) & 0xFFFFFFFF).astype(np.uint32)
    return _fmix32(_fmix32(np.atleast_1d(k)))


def hashed_rows(
    rows: np.ndarray | torch.Tensor,
    dim: int,
    table: int | np.ndarray,
    table_rows: int | np.ndarray,
    seed: int,
) -> torch.Tensor:
    """Initial weights [len(rows), dim] float32 of rows `rows` of table `table` (which has
    `table_rows` rows): U(-sqrt(1/table_rows), +sqrt(1/table_rows)). `table` and `table_rows`
    may also be arrays, one per row (rows of several tables at once)."""
    r = rows.numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
    r = r.astype(np.uint64)
    key = _table_key(seed, table)
    key = key[0] if np.ndim(table) == 0 else key
    with np.errstate(over="ignore"):
        lo = (r & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        hi = (r >> np.uint64(32)).astype(np.uint32)
        h = _fmix32(lo * np.uint32(0x9E3779B1) + key)
        h = _fmix32(h ^ (hi * np.uint32(0x27D4EB2F)))
        cols = np.arange(dim, dtype=np.uint32) * np.uint32(0x85EBCA6B)
        v = _fmix32(h[:, None] + cols[None, :])
    bound = np.sqrt(1.0 / np.asarray(table_rows, dtype=np.float64))
    lo_b = bound.astype(np.float32).reshape(-1, 1)
    width = (2 * bound).astype(np.float32).reshape(-1, 1)
    unit = (v >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / (1 << 24))  # [0, 1)
    return torch.from_numpy(unit * width - lo_b)


def hashed_table(rows: int, dim: int, table: int, seed: int) -> torch.Tensor:
    """Every row of a table, as `hashed_rows` gives them (made in chunks to bound memory)."""
    out = torch.empty(rows, dim)
    for start in range(0, rows, _CHUNK_ROWS):
        ids = np.arange(start, min(rows, start + _CHUNK_ROWS), dtype=np.int64)
        out[start : start + ids.size] = hashed_rows(ids, dim, table, rows, seed)
    return out


@torch.no_grad()
def hashed_init_(weights: list[torch.Tensor], seed: int) -> None:
    """Fill per-table weight views in place with the hashed initial values (table i = index i)."""
    for i, w in enumerate(weights):
        rows, dim = w.shape
        for start in range(0, rows, _CHUNK_ROWS):
            ids = np.arange(start, min(rows, start + _CHUNK_ROWS), dtype=np.int64)
            w[start : start + ids.size].copy_(hashed_rows(ids, dim, i, rows, seed))
