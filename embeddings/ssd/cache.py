"""The SSD tier's DRAM caches: a row cache (what the tier uses) and a 4 KiB block cache of the
same byte budget (what the page cache does: the comparison point).

`RowCache` keeps copies of single rows (weights and optimizer state) in one preallocated
[capacity, row floats] tensor, found through a hash map of the cached rows' global ids
(`SlotMap`: about 20 bytes per cached row; a dense id -> slot array would take 4 bytes for every
row of every table, 1 GB for Terabyte's 260M rows whatever the cache's size). Which rows stay:
- every row carries a priority: its count in the access profile (rows the profile saw often are
  the warm rows that should stay) plus the hits it has had while cached;
- when slots run out, the cache evicts in bulk (1/64 of its slots at a time, so the cost of
  choosing is spread over many admissions): the rows of lowest priority, the least recently used
  first among equals; the rows of the last PROTECT accesses (a staged mini-batch, the one being
  prefetched, and the refreshes between them) are never chosen: a staged row evicted before its
  write-back would be re-admitted on the step's own thread, evicting there;
- evicted dirty rows are handed back to the caller to be written to the file; a row that finds
  no slot (the cache is full of protected rows) is simply not admitted.
`BlockCache` is an LRU of whole 4 KiB blocks: it only counts (hits, misses, bytes), for the
benchmark that runs both on the same access stream.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numba
import numpy as np
import torch

EVICT_SHARE = 64  # evict at least capacity / EVICT_SHARE rows at a time
PROTECT = 4  # accesses whose rows are never evicted
_NEVER = torch.iinfo(torch.int64).max


_EMPTY = -1
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: consecutive ids spread apart


@numba.njit(cache=True, nogil=True)
def _home(key, size):
    return np.int64((np.uint64(key) * _MIX) >> np.uint64(1)) % size


@numba.njit(cache=True, nogil=True)
def _get(keys, vals, q, out):
    size = keys.size
    for i in range(q.size):
        at = _home(q[i], size)
        out[i] = -1
        while keys[at] != _EMPTY:
            if keys[at] == q[i]:
                out[i] = vals[at]
                break
            at = at + 1 if at + 1 < size else 0


@numba.njit(cache=True, nogil=True)
def _add(keys, vals, g, slots):
    size = keys.size
    for i in range(g.size):
        at = _home(g[i], size)
        while keys[at] != _EMPTY:
            at = at + 1 if at + 1 < size else 0
        keys[at] = g[i]
        vals[at] = slots[i]


@numba.njit(cache=True, nogil=True)
def _remove(keys, vals, g):
    """Linear probing's deletion without tombstones: the entries after the hole that could not
    live at their home move back into it, so every lookup still finds its key before a gap."""
    size = keys.size
    for i in range(g.size):
        at = _home(g[i], size)
        while keys[at] != g[i]:
            at = at + 1 if at + 1 < size else 0
        hole = at
        nxt = hole + 1 if hole + 1 < size else 0
        while keys[nxt] != _EMPTY:
            home = _home(keys[nxt], size)
            # the entry at nxt may fill the hole unless its home lies cyclically in (hole, nxt]
            if (nxt > hole and (home <= hole or home > nxt)) or (
                nxt < hole and (home <= hole and home > nxt)
            ):
                keys[hole], vals[hole] = keys[nxt], vals[nxt]
                hole = nxt
            nxt = nxt + 1 if nxt + 1 < size else 0
        keys[hole] = _EMPTY


class SlotMap:
    """global id -> slot for the cached rows: an open-addressing hash table (linear probing) of
    `capacity / LOAD` entries, so a lookup, an admission and an eviction each cost O(rows they
    touch), whatever the cache's size. (A sorted array merged on every admission cost 10+ ms per
    mini-batch at 4M cached rows: the staging's largest CPU cost in the Kaggle benchmark.)"""

    LOAD = 0.6  # at most this share of entries used: probes stay short
    BYTES_PER_ENTRY = 8 + 4  # key, slot (int32; `wide`: int64)

    def __init__(self, capacity: int, wide: bool = False) -> None:
        size = max(8, int(capacity / self.LOAD) + 1)
        self.keys = np.full(size, _EMPTY, dtype=np.int64)
        self.vals = np.zeros(size, dtype=np.int64 if wide else np.int32)
        self.capacity = capacity

    def get(self, gids: torch.Tensor) -> torch.Tensor:
        """int64 slots of `gids`, -1 where not cached."""
        out = np.empty(gids.numel(), dtype=np.int64)
        _get(self.keys, self.vals, gids.numpy().astype(np.int64, copy=False), out)
        return torch.from_numpy(out).view(gids.shape)

    def add(self, gids: torch.Tensor, slots: torch.Tensor) -> None:
        """Map `gids` (unique, not in the map; at most `capacity` in all) to `slots`."""
        if gids.numel():
            _add(self.keys, self.vals, gids.numpy().astype(np.int64, copy=False),
                 slots.numpy().astype(self.vals.dtype))  # fmt: skip

    def remove(self, gids: torch.Tensor) -> None:
        """Unmap `gids` (all in the map)."""
        if gids.numel():
            _remove(self.keys, self.vals, gids.numpy().astype(np.int64, copy=False))

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (key, value) in the map, in table order."""
        used = np.flatnonzero(self.keys != _EMPTY)
        return self.keys[used], self.vals[used].astype(np.int64)

    def clear(self) -> None:
        self.keys.fill(_EMPTY)

    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes


class RowCache:
    BOOKKEEPING_PER_SLOT = 8 + 1 + 8 + 8 + 8  # gid, dirty, prio, last, free stack

    def __init__(
        self,
        total_rows: int,
        row_floats: int,
        capacity: int,
        priority: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """`capacity` rows of `row_floats` float32 each (`row_floats=0`: bookkeeping only, for
        simulations); `priority(gids)` -> int64 profile counts (None: recency alone)."""
        self.capacity = capacity
        self.data = torch.zeros(capacity, row_floats) if row_floats else None
        self.total_rows = total_rows
        self.map = SlotMap(capacity)
        self.gid = torch.full((capacity,), -1, dtype=torch.int64)
        self.dirty = torch.zeros(capacity, dtype=torch.bool)
        self.prio = torch.zeros(capacity, dtype=torch.int64)
        self.last = torch.zeros(capacity, dtype=torch.int64)
        self._free = torch.arange(capacity - 1, -1, -1, dtype=torch.int64)  # a stack
        self.n_free = capacity
        self.priority = priority
        self.tick = 1
        self.hits = self.misses = self.evictions = 0

    @property
    def used(self) -> int:
        return self.capacity - self.n_free

    def bookkeeping_bytes(self) -> int:
        """DRAM besides the rows themselves: the id map and the per-slot arrays."""
        return self.map.nbytes() + self.capacity * self.BOOKKEEPING_PER_SLOT

    def next_access(self) -> None:
        """Start of a new access (a mini-batch's rows): recency is counted in accesses."""
        self.tick += 1

    def slots(self, gids: torch.Tensor) -> torch.Tensor:
        """Slots of `gids` (-1: not cached), nothing counted or touched."""
        return self.map.get(gids)

    def lookup(self, gids: torch.Tensor) -> torch.Tensor:
        """Slots of `gids` (-1: not cached); counts hits and misses and touches the hits."""
        slots = self.map.get(gids)
        hit = slots >= 0
        found = slots[hit]
        self.last[found] = self.tick
        self.prio[found] += 1
        n_hit = int(found.numel())
        self.hits += n_hit
        self.misses += gids.numel() - n_hit
        return slots

    def admit(self, gids: torch.Tensor, dirty: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots for rows `gids` (not cached; the caller fills `data[slots]`): returns (slots,
        evicted slots whose dirty rows the caller must write out *before* filling). Fewer slots
        than rows when the cache cannot make room: rows beyond `slots.numel()` are not admitted."""
        n = gids.numel()
        evicted = torch.zeros(0, dtype=torch.int64)
        if n > self.n_free:
            evicted = self._evict(max(n - self.n_free, self.capacity // EVICT_SHARE))
        k = min(n, self.n_free)
        slots = self._free[self.n_free - k : self.n_free].clone()
        self.n_free -= k
        mine = gids[:k]
        self.map.add(mine, slots)
        self.gid[slots] = mine
        self.dirty[slots] = dirty
        self.prio[slots] = self.priority(mine) if self.priority is not None else 0
        self.last[slots] = self.tick
        return slots, evicted

    def _evict(self, k: int) -> torch.Tensor:
        """Free `k` slots (fewer if the rest are protected): lowest priority, then oldest.
        Returns the freed slots that were dirty *and* still hold their rows' data (their
        `gid` is kept until the caller has written them: `release`)."""
        score = self.prio * (1 << 32) + self.last
        protected = (self.gid < 0) | (self.last > self.tick - PROTECT)
        score = score.masked_fill(protected, _NEVER)
        k = min(k, int((~protected).sum()))
        if k <= 0:
            return torch.zeros(0, dtype=torch.int64)
        victims = torch.topk(score, k, largest=False, sorted=False).indices
        self.evictions += k
        self.map.remove(self.gid[victims])
        dirty = victims[self.dirty[victims]]
        self._evicted_gids = self.gid[dirty].clone()
        self.gid[victims] = -1
        self.dirty[victims] = False
        self._free[self.n_free : self.n_free + k] = victims
        self.n_free += k
        return dirty

    def evicted_gids(self) -> torch.Tensor:
        """The global ids of the dirty slots the last `admit` returned."""
        return self._evicted_gids


class BlockCache:
    """LRU of 4 KiB blocks (`capacity` of them), counting only: what the page cache would hit."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.row_hits = self.row_misses = 0
        self.block_hits = self.block_misses = 0

    def access(self, gids: np.ndarray, rows_per_block: int) -> None:
        """One mini-batch's unique rows."""
        blocks, rows = np.unique(gids // rows_per_block, return_counts=True)
        lru = self._lru
        for b, r in zip(blocks.tolist(), rows.tolist()):
            if b in lru:
                lru.move_to_end(b)
                self.block_hits += 1
                self.row_hits += r
            else:
                lru[b] = None
                self.block_misses += 1
                self.row_misses += r
                if len(lru) > self.capacity:
                    lru.popitem(last=False)
