"""The SSD tier's DRAM caches: a row cache (what the tier uses) and a 4 KiB block cache of the
same byte budget (what the page cache does: the comparison point).

`RowCache` keeps copies of single rows (weights and optimizer state) in one preallocated
[capacity, row floats] tensor, found through a sorted map of the cached rows' global ids
(`SlotMap`: 12 bytes per cached row; a dense id -> slot array would take 4 bytes for every row of
every table, 1 GB for Terabyte's 260M rows whatever the cache's size). Which rows stay:
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

import numpy as np
import torch

EVICT_SHARE = 64  # evict at least capacity / EVICT_SHARE rows at a time
PROTECT = 4  # accesses whose rows are never evicted
_NEVER = torch.iinfo(torch.int64).max


class SlotMap:
    """global id -> slot for the cached rows: their ids sorted, with their slots. Lookups are one
    binary search per id; adding or removing rows merges in one pass over the map (vectorised),
    which admissions and bulk evictions amortise over thousands of rows."""

    def __init__(self) -> None:
        self.keys = torch.zeros(0, dtype=torch.int64)
        self.vals = torch.zeros(0, dtype=torch.int32)

    def get(self, gids: torch.Tensor) -> torch.Tensor:
        """int64 slots of `gids`, -1 where not cached."""
        if not self.keys.numel():
            return torch.full(gids.shape, -1, dtype=torch.int64)
        at = torch.searchsorted(self.keys, gids).clamp(max=self.keys.numel() - 1)
        return torch.where(self.keys[at] == gids, self.vals[at].long(), -1)

    def add(self, gids: torch.Tensor, slots: torch.Tensor) -> None:
        """Map `gids` (unique, not in the map) to `slots`."""
        if not gids.numel():
            return
        g, order = torch.sort(gids)
        n, k = self.keys.numel(), g.numel()
        at = torch.searchsorted(self.keys, g) + torch.arange(k)  # their places in the merge
        old = torch.ones(n + k, dtype=torch.bool)
        old[at] = False
        keys = torch.empty(n + k, dtype=torch.int64)
        vals = torch.empty(n + k, dtype=torch.int32)
        keys[old], vals[old] = self.keys, self.vals
        keys[at], vals[at] = g, slots[order].to(torch.int32)
        self.keys, self.vals = keys, vals

    def remove(self, gids: torch.Tensor) -> None:
        """Unmap `gids` (all in the map)."""
        if not gids.numel():
            return
        keep = torch.ones(self.keys.numel(), dtype=torch.bool)
        keep[torch.searchsorted(self.keys, gids)] = False
        self.keys, self.vals = self.keys[keep], self.vals[keep]

    def nbytes(self, capacity: int) -> int:
        return capacity * (8 + 4)


class RowCache:
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
        self.map = SlotMap()
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
        per_slot = 8 + 1 + 8 + 8 + 8  # gid, dirty, prio, last, free stack
        return self.map.nbytes(self.capacity) + self.capacity * per_slot

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
