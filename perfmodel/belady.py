"""The fewest misses any row cache of a given size can have on a stream of mini-batches: Belady's
MIN (evict the row whose next use is farthest; never keep a row that is not used again), which a
training tier could approach because it knows every future batch's ids before it runs.

It is a bound, not a policy: what the tier's own cache (embeddings/ssd/cache.py) misses beyond it
is what a better policy could still save, and the bound's misses times the CPU of one read is the
least the tier can cost a step (docs/measurements/scm.md). Rows are counted per mini-batch: a
batch's rows are unique, and all of them are in DRAM while it trains (the staging slots), so a
miss is a row a batch needs that the cache did not keep from earlier batches.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

_NEVER = np.iinfo(np.int64).max


@numba.njit(cache=True)
def _push(heap_key, heap_id, size, k, v):
    j = size
    heap_key[j], heap_id[j] = k, v
    while j > 0:
        p = (j - 1) // 2
        if heap_key[p] >= heap_key[j]:
            break
        heap_key[p], heap_key[j] = heap_key[j], heap_key[p]
        heap_id[p], heap_id[j] = heap_id[j], heap_id[p]
        j = p
    return size + 1


@numba.njit(cache=True)
def _pop(heap_key, heap_id, size):
    k, v = heap_key[0], heap_id[0]
    size -= 1
    heap_key[0], heap_id[0] = heap_key[size], heap_id[size]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and heap_key[c + 1] > heap_key[c]:
            c += 1
        if heap_key[j] >= heap_key[c]:
            break
        heap_key[j], heap_key[c] = heap_key[c], heap_key[j]
        heap_id[j], heap_id[c] = heap_id[c], heap_id[j]
        j = c
    return k, v, size


@numba.njit(cache=True)
def _min_misses(ids, starts, next_batch, capacity, counted_from):
    """Misses over the batches (batch b's rows: ids[starts[b]:starts[b + 1]], each row's next
    batch in next_batch), counting batches >= counted_from: a batch misses the rows the cache does
    not hold; then the cache keeps, of what it held and the batch's rows, the `capacity` rows used
    again soonest (a row not used again is dropped). A max-heap of (next use, row); an entry
    that no longer matches its row's next use is skipped."""
    heap_key = np.empty(ids.size + 1, dtype=np.int64)
    heap_id = np.empty(ids.size + 1, dtype=np.int64)
    size = 0
    nxt = {}  # cached row -> its next use
    misses = 0
    for b in range(starts.size - 1):
        lo, hi = starts[b], starts[b + 1]
        if b >= counted_from:
            for i in range(lo, hi):
                if ids[i] not in nxt:
                    misses += 1
        for i in range(lo, hi):
            g, nb = ids[i], next_batch[i]
            if nb == _NEVER:
                if g in nxt:
                    del nxt[g]
                continue
            nxt[g] = nb
            size = _push(heap_key, heap_id, size, nb, g)
        while len(nxt) > capacity:  # drop the rows used farthest ahead
            k, v, size = _pop(heap_key, heap_id, size)
            if v in nxt and nxt[v] == k:
                del nxt[v]
        if size > 2 * len(nxt) + 1024:  # mostly stale entries: rebuild from the live ones
            size = 0
            for v, k in nxt.items():
                size = _push(heap_key, heap_id, size, k, v)
    return misses


def min_misses(batches: list[torch.Tensor], capacity: int, counted_from: int = 0) -> int:
    """The fewest misses a cache of `capacity` rows can have on `batches` (each a batch's
    unique rows, in run order), counting batches from `counted_from` on (the cache starts
    empty; the ones before warm it as well as any policy could)."""
    if not batches:
        return 0
    ids = torch.cat(batches).numpy().astype(np.int64)
    sizes = np.array([b.numel() for b in batches], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    batch = np.repeat(np.arange(len(batches), dtype=np.int64), sizes)
    order = np.lexsort((batch, ids))  # by row, then batch: each access's next one follows it
    next_batch = np.full(ids.size, _NEVER, dtype=np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    next_batch[order[:-1][same]] = batch[order[1:][same]]
    return int(_min_misses(ids, starts, next_batch, int(capacity), int(counted_from)))
