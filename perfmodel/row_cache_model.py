"""The SSD tier's DRAM row cache over a run: hits, misses and disk I/O per step, predicted.

A tiered run's cache starts empty and its tier file fresh: a miss on a row never written is
computed (`row_init`), not read, and a row is written only when the cache evicts it dirty. So
the first steps read nothing from the disk, and the hit rate climbs as the cache fills; where
the cache holds more rows than the run ever touches, it never reads at all. A prediction of the
steady state alone was 24-31% off on runs of a few hundred steps (docs/measurements/planner.md).

What `run_io` predicts, per step s of the run, averaged over the steps a prediction stands for:
- the first `len(stream)` steps: the cache's own code (`embeddings.ssd.cache.RowCache`,
  bookkeeping only) replayed on the run's first batches' cold rows, in order, as a run feeds it
  (`replay_row_cache`), with the map of blocks written so far (what a fresh tier can read);
  where every row read fits the cache nothing is evicted, and the same figures are counted
  with one sort instead (`_replay_without_evictions`: a Terabyte-sized cache's replays took
  minutes of a plan);
- after them: the distinct cold rows the run has touched by step k, U(k), counted exactly on
  the stream, fitted in log-log (`unseen_curve`) and extrapolated, capped at the cold rows there
  are. Until the cache holds U(s) rows, every row
  seen stays: a step misses only its new rows, U(s+1) - U(s). Once full (s >= T, U(T) = the
  cache's rows) the hit rate stays at an LRU cache's under independent references, 1 - U'(T) / R
  for R cold rows a step (the policy keeps rows by profile count and hits, which does no worse:
  the replay's own rate where the cache filled within it, and the profile-ranked steady state
  `warm_rows` gives, raise it). Every miss then evicts a row, dirty (every staged row is written
  back): those rows' blocks become written, so a fresh tier's share of written blocks grows
  with the evictions, and a miss is a read when its row was evicted before (every miss but the
  step's new rows) or its block was written by another row.
Reads and patched blocks per step become time through the disk's measured IOPS at the tier's
queue depth (`perfmodel.disk.read_seconds`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from embeddings.row_layout import table_row_base
from embeddings.ssd.cache import RowCache

WRITEBACK_LAG = 2  # a staged batch's rows are written back this many stagings later
GRID = 2000  # steps past the stream evaluated one by one; beyond, on a geometric grid


@dataclass
class CacheReplay:
    hits: int
    misses: int
    miss_blocks: list[int]  # per batch: 4 KiB blocks the misses fall in
    evict_blocks: list[int]  # per batch: blocks the evicted dirty rows patch (read + write)
    evictions: int = 0  # rows the cache evicted (warm-up excluded)
    hits_per_batch: list[int] | None = None
    misses_per_batch: list[int] | None = None
    read_blocks: list[int] | None = None  # per batch: miss blocks a fresh tier has written
    written_blocks: int = 0  # blocks written by the end

    @property
    def hit_rate(self) -> float | None:
        n = self.hits + self.misses
        return self.hits / n if n else None


def counts_priority(counts: list[np.ndarray], sizes: list[int]):
    """`embeddings.ssd.collection.profile_priority`'s function (each row's profile count, 0 when
    unseen; None when the profile saw no row), read from the profile's own per-table count
    arrays: the planner holds them anyway, and indexing them is a few array passes per call
    where a binary search over every seen row's id (millions) was most of a replay's time."""
    if not any(c.any() for c in counts):
        return None
    base = table_row_base(sizes).numpy()

    def priority(g: torch.Tensor) -> torch.Tensor:
        x = g.numpy().astype(np.int64, copy=False).ravel()
        table = np.searchsorted(base, x, side="right") - 1
        out = np.zeros(x.size, dtype=np.int64)
        for t in np.unique(table):
            mine = table == t
            out[mine] = counts[t][x[mine] - base[t]]
        return torch.from_numpy(out).view(g.shape)

    return priority


def seen_rows(counts: list[np.ndarray], sizes: list[int]) -> tuple[np.ndarray, Any]:
    """The rows a profile saw (global ids, most counted first, ties by id) and the row cache's
    priority function: both read every count once, so a plan makes them once (its PlanMemo)."""
    base = table_row_base(sizes).numpy()
    gids = np.concatenate([np.flatnonzero(c) + b for c, b in zip(counts, base)])
    cnt = np.concatenate([c[c > 0] for c in counts])
    return gids[np.lexsort((gids, -cnt))], counts_priority(counts, sizes)


def warm_rows(ranked: np.ndarray, hot, capacity: int, chunk: int) -> list[torch.Tensor]:
    """A long run's cache as the profile ranks it, as reads: the `capacity` cold rows the
    profile counts most (`ranked`: `seen_rows`'s), read least-counted first in chunks (the
    policy keeps rows by profile count plus hits)."""
    if not capacity or not ranked.size:
        return []
    top, at, step = [], 0, max(capacity, 1 << 16)
    while at < ranked.size and sum(t.size for t in top) < capacity:  # cold ones, in rank order
        part = ranked[at : at + step]
        top.append(part[hot.slots(torch.from_numpy(part)).numpy() < 0])
        at += step
    top = np.concatenate(top)[:capacity][::-1]  # the top `capacity`, coldest first
    return [torch.from_numpy(np.sort(top[a : a + chunk])) for a in range(0, top.size, chunk)]


def replay_row_cache(
    batches: list[torch.Tensor], total_rows: int, capacity: int, rows_per_block: int,
    priority=None, lag: int = WRITEBACK_LAG, warm: list[torch.Tensor] = (), layout=None,
) -> CacheReplay:  # fmt: skip
    """The SSD tier's row cache (its own code, bookkeeping only) fed what a tiered run feeds it:
    each staging's unique cold rows read (`ScmTier.read_rows`: lookup, misses admitted clean),
    and `lag` stagings later the same rows written back (`ScmTier._store`: cached rows marked
    dirty, the rest admitted dirty). Evicted dirty rows are written to their blocks. `warm`:
    reads made first and not counted (`warm_rows`). Where the cache never has to evict
    (`_replay_without_evictions`), the same figures are counted without it. `layout`: the tier
    file's row layout (embeddings/ssd/layout.py; None: row-id order), which decides the blocks
    rows fall in."""
    if capacity:
        counted = _replay_without_evictions(batches, capacity, rows_per_block, warm, layout)
        if counted is not None:
            return counted
    return _replay_policy(
        batches, total_rows, capacity, rows_per_block, priority, lag, warm, layout
    )


def _replay_without_evictions(
    batches: list[torch.Tensor], capacity: int, rows_per_block: int,
    warm: list[torch.Tensor] = (), layout=None,
) -> CacheReplay | None:  # fmt: skip
    """`replay_row_cache`'s figures where every row the replay reads (`warm` and `batches`, each
    batch's rows unique) fits the cache: nothing is evicted, so the cache holds every row read
    so far, a row is a hit exactly when an earlier batch (or `warm`) read it, the write-backs
    find their rows cached (no row goes to the file) and no block is written. Counted with
    sorts, not the cache's per-batch bookkeeping (a Terabyte-sized cache of 10 GiB replayed its
    warm rows for 20 s). None where that does not hold (the policy decides: `_replay_policy`)."""
    sizes = [int(b.numel()) for b in batches]
    parts = [w.numpy().astype(np.int64, copy=False) for w in warm]
    parts += [b.numpy().astype(np.int64, copy=False) for b in batches]
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    n_warm = ids.size - sum(sizes)
    # warm reads are access 0, batch b is access b + 1: sorted by (row, access) as one int64 key
    # (numpy's sort; a lexsort, np.unique's hash or its axis= took seconds at a million ids),
    # each row's first reader is the one that misses (and admits) it
    accesses = len(batches) + 1
    which = np.concatenate([np.zeros(n_warm, dtype=np.int64),
                            np.repeat(np.arange(1, accesses, dtype=np.int64), sizes)])  # fmt: skip
    key = _row_access_keys(ids, which, accesses)
    if key is None:
        return None
    ids_s, which_s = key // accesses, key % accesses - 1
    first = np.ones(ids_s.size, dtype=bool)
    first[1:] = ids_s[1:] != ids_s[:-1]
    if int(first.sum()) > capacity:
        return None  # the cache fills: what it evicts is the policy's
    # a row read twice by one access: the cache's own bookkeeping decides (it never happens for
    # a batch's unique rows)
    if np.any(key[1:] == key[:-1]):
        return None
    n = len(batches)
    miss = first & (which_s >= 0)
    hit = ~first & (which_s >= 0)
    misses_b = np.bincount(which_s[miss], minlength=n)
    hits_b = np.bincount(which_s[hit], minlength=n)
    # the blocks each batch's misses fall in, counted once per batch
    blocks = _block_of(ids_s[miss], rows_per_block, layout)
    span = int(blocks.max()) + 1 if blocks.size else 1  # one key per (batch, block): a flat sort
    pair = np.sort(which_s[miss] * span + blocks)
    pair = pair[np.append(True, pair[1:] != pair[:-1])] if pair.size else pair
    miss_blocks = np.bincount(pair // span, minlength=n)
    zeros = [0] * n
    return CacheReplay(
        int(hits_b.sum()), int(misses_b.sum()), [int(x) for x in miss_blocks], zeros, 0,
        [int(x) for x in hits_b], [int(x) for x in misses_b], list(zeros), 0,
    )  # fmt: skip


def _row_access_keys(ids: np.ndarray, which: np.ndarray, accesses: int) -> np.ndarray | None:
    """(row, access) pairs as sorted int64 keys row * accesses + access; None where a row id is
    negative or too large for the key."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= np.iinfo(np.int64).max // accesses):
        return None
    return np.sort(ids * accesses + which)


def _block_of(ids: np.ndarray, rows_per_block: int, layout=None) -> np.ndarray:
    """The tier file's block of each row: by its slot in `layout` (None: row-id order)."""
    return ids // rows_per_block if layout is None else layout.blocks(ids, rows_per_block)


def _replay_policy(
    batches: list[torch.Tensor], total_rows: int, capacity: int, rows_per_block: int,
    priority=None, lag: int = WRITEBACK_LAG, warm: list[torch.Tensor] = (), layout=None,
) -> CacheReplay:  # fmt: skip
    """`replay_row_cache` by the cache's own code, batch by batch."""
    cache = RowCache(total_rows, 0, capacity, priority)

    def block_of(ids: np.ndarray) -> np.ndarray:
        return _block_of(ids, rows_per_block, layout)

    if capacity:
        for ids in warm:
            cache.next_access()
            slots = cache.lookup(ids)
            cache.admit(ids[slots < 0], dirty=False)
        cache.hits = cache.misses = cache.evictions = 0
    # the blocks written so far, one flag per block of the tier (a sorted union per batch cost
    # more than the cache's bookkeeping at a few hundred thousand blocks)
    written = np.zeros(max(1, -(-total_rows // rows_per_block)), dtype=bool)
    miss_blocks, evict_blocks, read_blocks, hits_b, misses_b = [], [], [], [], []
    pending: list[torch.Tensor] = []
    evicted_now: list[np.ndarray] = []

    def admit(gids: torch.Tensor, dirty: bool) -> None:
        slots, ev = cache.admit(gids, dirty)
        if ev.numel():
            evicted_now.append(block_of(cache.evicted_gids().numpy()))
        if dirty and slots.numel() < gids.numel():  # no room: written straight to the file
            evicted_now.append(block_of(gids[slots.numel() :].numpy()))

    def store(ids: torch.Tensor) -> None:
        if not capacity:
            evicted_now.append(block_of(ids.numpy()))
            return
        slots = cache.slots(ids)
        hit = slots >= 0
        cache.dirty[slots[hit]] = True
        miss = torch.nonzero(~hit).squeeze(1)
        if miss.numel():
            admit(ids[miss], dirty=True)

    for ids in batches:
        evicted_now.clear()
        cache.next_access()
        h0 = cache.hits
        if capacity:
            slots = cache.lookup(ids)
            miss = ids[slots < 0]
        else:
            cache.misses += ids.numel()
            miss = ids
        hits_b.append(cache.hits - h0)
        misses_b.append(int(miss.numel()))
        miss_block = np.unique(block_of(miss.numpy()))
        miss_blocks.append(int(miss_block.size))
        read_blocks.append(int(written[miss_block].sum()))
        if capacity and miss.numel():
            admit(miss, dirty=False)
        pending.append(ids)
        if len(pending) > lag:
            store(pending.pop(0))
        ev = np.unique(np.concatenate(evicted_now)) if evicted_now else np.zeros(0, np.int64)
        evict_blocks.append(int(ev.size))
        written[ev] = True
    return CacheReplay(
        cache.hits, cache.misses, miss_blocks, evict_blocks, cache.evictions,
        hits_b, misses_b, read_blocks, int(written.sum()),
    )  # fmt: skip


def new_rows(stream: list[torch.Tensor]) -> np.ndarray:
    """Per batch of `stream` (each a batch's unique cold rows, in run order): how many of its
    rows no earlier batch had: U(k) - U(k-1), counted exactly."""
    if not stream:
        return np.zeros(0, dtype=np.int64)
    ids = torch.cat(stream).numpy().astype(np.int64, copy=False)
    which = np.repeat(np.arange(len(stream), dtype=np.int64), [t.numel() for t in stream])
    key = _row_access_keys(ids, which, len(stream))
    if key is None:  # ids past the sort key's range: np.unique's first occurrences
        _, first = np.unique(ids, return_index=True)
        return np.bincount(which[first], minlength=len(stream))
    rows = key // len(stream)
    first = np.append(True, rows[1:] != rows[:-1]) if rows.size else rows.astype(bool)
    return np.bincount(key[first] % len(stream), minlength=len(stream))


def unseen_curve(new: np.ndarray, cap: int) -> Callable[[np.ndarray], np.ndarray]:
    """U(k), the distinct rows touched in the first k steps, past the counted ones: log U as a
    quadratic in log k fitted over the counted steps from the fourth (the log-log slope of a
    Zipf stream's U falls as k grows: 0.99 over the first 8 steps, 0.83 at 128-256 on the
    synthetic data; a straight line through the last 24 steps put U(256) 30% high, the quadratic
    3%), through the last counted point, flat once its slope reaches zero, at most `cap` (the
    cold rows there are)."""
    u = np.cumsum(new).astype(np.float64)
    n = u.size
    if n == 0 or u[-1] <= 0:
        return lambda k: np.zeros_like(np.asarray(k, dtype=np.float64))
    ks = np.arange(min(4, n), n + 1)
    ks = ks[u[ks - 1] > 0]
    c2, c1 = 0.0, 1.0
    if ks.size >= 4:
        c2, c1, _ = np.polyfit(np.log(ks), np.log(u[ks - 1]), 2)
        if c2 > 0:  # convex: no curvature to extrapolate; a straight line
            c2, c1 = 0.0, float(np.polyfit(np.log(ks), np.log(u[ks - 1]), 1)[0])
    elif ks.size >= 2:
        c1 = float(np.polyfit(np.log(ks), np.log(u[ks - 1]), 1)[0])
    c1 = min(max(float(c1), 0.0), 1.0) if c2 == 0 else float(c1)
    x_n = np.log(n)
    x_top = -c1 / (2 * c2) if c2 < 0 else np.inf  # where the slope reaches zero

    def curve(k):
        x = np.minimum(np.log(np.maximum(np.asarray(k, dtype=np.float64), 1.0)), x_top)
        x = np.maximum(x, min(x_n, x_top))  # past the counted steps only
        y = c1 * (x - x_n) + c2 * (x * x - x_n * x_n)
        return np.minimum(u[-1] * np.exp(y), float(cap))

    return curve


def stream_replay(
    stream: list[torch.Tensor], total_rows: int, capacity: int, rows_per_block: int, priority,
    layout=None,
) -> CacheReplay:  # fmt: skip
    """The row cache replayed on a run's first batches (`run_io`'s replay), blocks counted
    through the tier file's `layout`."""
    seen = int(new_rows(stream).sum())
    # a cache larger than every row the stream touches never evicts within it: the same replay
    return replay_row_cache(
        stream, total_rows, min(capacity, seen), rows_per_block, priority, layout=layout
    )


@dataclass
class RunIO:
    """The row cache and the disk over a window of a run's steps: means per step."""

    hit_rate: float
    misses: float  # rows
    reads: float  # 4 KiB blocks read (misses on written blocks)
    rmw: float  # blocks patched by evicted dirty rows (each read and written)
    disk_s: float  # seconds of disk per step: the reads, and the patches' read and write
    fill_step: float | None  # the step the cache is full at (None: not within the window's end)
    steady_hit_rate: float  # the hit rate once full
    replayed_steps: int
    # seconds of disk at each step (or grid point) of the window, and the steps each stands for:
    # what a step hides of it depends on each step's reads, not on their mean
    disk_by_step: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_weights: np.ndarray = field(default_factory=lambda: np.zeros(0))


def run_io(
    stream: list[torch.Tensor], total_rows: int, cold_rows: int, capacity: int,
    rows_per_block: int, priority, window: tuple[int, int], seconds: Callable[[float], float],
    steady_floor: float = 0.0, fresh: bool = True, replayed: CacheReplay | None = None,
    layout=None, patch_scale: float = 1.0,
) -> RunIO:  # fmt: skip
    """The row cache of `capacity` rows over steps [window) of a run whose first batches' unique
    cold rows are `stream` (module docstring). `seconds(blocks)`: the disk's time for a
    staging's reads; `steady_floor`: a hit rate the full cache keeps at least (the profile-ranked
    steady state); `fresh`: the tier file starts unwritten (False: every block is on disk, as
    after `ScmTier.fill`); `replayed`: `stream_replay`'s replay of the same stream and cache,
    where made already (a prediction's two windows share it; made with the same `layout`);
    `layout`: the tier file's row layout (blocks per miss follow it); `patch_scale`: blocks
    patched per evicted row against one each (the write-back log's sweeps: `patch_share`)."""
    first, end = int(window[0]), int(window[1])
    n = len(stream)
    if not n or not sum(t.numel() for t in stream):  # no cold row: nothing to cache or read
        return RunIO(0.0, 0.0, 0.0, 0.0, 0.0, None, 0.0, n)
    new = new_rows(stream)
    R = float(np.mean([t.numel() for t in stream])) if stream else 0.0
    total_blocks = max(1, -(-total_rows // rows_per_block))
    rep = (
        replayed
        if replayed is not None
        else stream_replay(stream, total_rows, capacity, rows_per_block, priority, layout)
    )
    hits_b = np.asarray(rep.hits_per_batch, dtype=np.float64)
    misses_b = np.asarray(rep.misses_per_batch, dtype=np.float64)
    reads_b = np.asarray(rep.read_blocks if fresh else rep.miss_blocks, dtype=np.float64)
    rmw_b = np.asarray(rep.evict_blocks, dtype=np.float64)
    # blocks per missed row and per evicted row, as the stream had them (1 where rows are sparse)
    per_miss = sum(rep.miss_blocks) / rep.misses if rep.misses else 1.0
    evicting = rmw_b > 0  # blocks patched per missed row, over the steps that evicted
    per_evict = rmw_b[evicting].sum() / misses_b[evicting].sum() if evicting.any() else per_miss
    U = unseen_curve(new, cold_rows)
    full = capacity < cold_rows
    fill = None
    if full:
        if rep.evictions or capacity == 0:
            fill = float(np.argmax(np.cumsum(new) >= capacity)) if capacity else 0.0
        else:  # U(T) = capacity, past the stream
            lo, hi = float(n), float(max(n, 1))
            while U(hi) < capacity and hi < 1e12:
                hi *= 2
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if U(mid) < capacity else (lo, mid)
            fill = hi if U(hi) >= capacity else None
    steady = 1.0
    if capacity == 0:
        steady = 0.0
    elif fill is not None:
        at = max(fill, 1.0)
        if at < n:  # new rows a step there, counted (smoothed over a few steps)
            fresh = float(np.mean(new[int(at) : int(at) + 8]))
        else:
            fresh = float(U(at + 1) - U(at))
        lru = 1.0 - fresh / R if R else 0.0
        if capacity < R:  # not even a step's rows: kept for a fraction of the next step
            lru *= capacity / R
        steady = max(lru, steady_floor)
        if rep.evictions and n - fill >= 4:  # the replay's own rate once full
            tail = slice(int(fill) + (n - int(fill)) // 2, n)
            h, m = hits_b[tail].sum(), misses_b[tail].sum()
            steady = max(steady, float(h / max(h + m, 1)))
    # the replayed steps, then one by one, then a geometric grid (weights: the steps each stands for)
    steps, weights, rows = [], [], []
    for s in range(min(n, end)):
        steps.append(s)
        weights.append(1.0)
        rows.append((hits_b[s], misses_b[s], reads_b[s], rmw_b[s]))
    if end > n:
        pts = np.arange(n, min(end, n + GRID), dtype=np.float64)
        if end > n + GRID:
            pts = np.concatenate([pts, np.unique(np.geomspace(n + GRID, end, GRID))])
        edges = np.append(pts, end)
        written = rep.written_blocks / total_blocks if fresh else 1.0
        for s, w in zip(pts, np.diff(edges)):
            fresh_rows = float(U(s + 1) - U(s))
            if fill is None or s < fill:
                miss = fresh_rows
                evict = 0.0
            else:
                miss = max(R * (1.0 - steady), fresh_rows)
                evict = miss
            reread = max(miss - fresh_rows, 0.0)
            read = (reread + fresh_rows * written) * per_miss
            patch = evict * per_evict
            steps.append(s)
            weights.append(w)
            rows.append((max(R - miss, 0.0), miss, read, patch))
            if fresh and patch:
                written = 1.0 - (1.0 - written) * float(np.exp(-patch * w / total_blocks))
    s = np.asarray(steps, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    part = (s + w > first) & (s < end)
    # the part of each grid cell inside the window
    w = np.where(part, np.minimum(s + w, end) - np.maximum(s, first), 0.0)
    if not w.sum():
        w = np.ones_like(s)
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
    arr[:, 3] *= patch_scale
    hits, misses, reads, rmw = (float(np.average(arr[:, i], weights=w)) for i in range(4))
    disk = np.array([seconds(r) + 2 * seconds(p) for _, _, r, p in arr])
    keep = w > 0
    return RunIO(
        hit_rate=hits / (hits + misses) if hits + misses else 0.0, misses=misses, reads=reads,
        rmw=rmw, disk_s=float(np.average(disk, weights=w)), fill_step=fill,
        steady_hit_rate=steady, replayed_steps=n, disk_by_step=disk[keep], step_weights=w[keep],
    )  # fmt: skip
