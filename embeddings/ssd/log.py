"""The SSD tier's write-back log: the rows the row cache evicts dirty are appended to `log.dat`,
packed `rows_per_block` to a 4 KiB block, instead of each being patched into its own block.

Why: a tier with a cold working set evicts a dirty row for nearly every row it reads, and
patching one row into its block costs a 4 KiB read and a 4 KiB write of that block (the block's
other rows are not in DRAM): two requests of 4-6 us of the process's CPU each on the development
VM (docs/measurements/scm.md), beside the one read that brought the row in. Appended, 63 rows
of dim 16 share one write. The logged rows still have to go home, but not one at a time:
a sweep takes every row logged before it started, in the file's order, and patches each home
block once for all of its rows, in runs of consecutive blocks (one request each). The more rows
the log holds, the more rows a home block gets per sweep and the longer the runs: the log's map
(below) is what that costs in DRAM, so the tier takes it out of its row cache's bytes
(`split_cache`).

The log is a ring of `2.25 x live_rows` row slots. A row's slot is a logical number that only
grows (its place in the file: slot mod ring size), so a slot written after a sweep began is
newer than every slot the sweep holds. A map (global id -> slot; `SlotMap`, about 27 bytes an
entry) says where each logged row's newest copy is. When the rows written since the ring's tail
reach `live_rows`, a sweep starts: it takes the map's entries (all older than the head), sorted
by home slot, and patches them home a slice after each append (1.25 times the rows appended: the
sweep runs beside the appends, not in bursts, and ends before the ring fills); an entry whose
row was logged again since (a newer slot) is skipped, and stays. When the sweep ends, every slot
before its start is dead: the ring's tail moves there. A ring that fills anyway (appends larger
than the rest of the sweep) finishes the sweep at once.

What the log holds matters only between checkpoints: the tier's `flush` (before every checkpoint)
writes every logged row home with the cache's dirty rows and empties the log, so a checkpoint's
file is the home blocks alone, as without a log, and a restore or a resume starts the log empty.
Every block written here carries the tier's trailer (index, tier id, CRC-32), checked when read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from embeddings.ssd.cache import SlotMap
from embeddings.ssd.file import BlockFile, aligned_blocks, block_rows, stamp

LOG = "log.dat"
MIN_SLICE = 4096  # rows a sweep patches home after an append, at least
SLICE_FACTOR = 1.25  # and this many times the rows appended: a sweep ends after 0.8 x live_rows
_MAP_ENTRIES_PER_ROW = 2  # mapped rows at most: a sweep's live_rows and 0.8 x as many since
_RING = 2.25  # the ring's slots per live row: those, and a quarter of it to append into
PAYS = 0.8  # a log is kept where its sweeps patch at most this share of a block per evicted row
BYTES_PER_ROW = int(_MAP_ENTRIES_PER_ROW * (8 + 8) / SlotMap.LOAD) + 1  # map bytes per live row


def split_cache(
    cache_bytes: int, row_bytes: int, rows_per_block: int, share: float, rows: int
) -> tuple[int, int]:
    """(row cache rows, log live rows) from the tier's DRAM budget for its `rows`: the log's map
    takes `share` of it, for as many rows as the cache holds at most (the log's disk stays
    near the cache's size). No log (0 rows) where it cannot pay: a cache that holds every row
    evicts nothing; a log too small to fill 2 blocks between sweeps; one whose sweeps would
    patch more than PAYS of a block per evicted row, its own write and read of the row counted
    (`patch_share`: wide rows in huge tables, where a sweep patches one row a block as the
    cache's evictions do)."""
    if cache_bytes >= rows * row_bytes:
        return rows, 0
    live = int(cache_bytes * share) // BYTES_PER_ROW
    live = min(live, cache_bytes // (row_bytes + BYTES_PER_ROW))  # live <= the cache's rows
    if live < 2 * rows_per_block or patch_share(live, rows, rows_per_block) > PAYS:
        live = 0
    return (cache_bytes - live * BYTES_PER_ROW) // row_bytes, live


def patch_share(live_rows: int, rows: int, rows_per_block: int) -> float:
    """Blocks read and written per row the cache evicts, with the log, against one without it
    (each row its own block): a sweep of `live_rows` rows spread over the file's blocks patches
    blocks(1 - exp(-live_rows / blocks)) of them, and every row is also written to the log and
    read back once, `rows_per_block` to a block. For the planner's prediction."""
    blocks = max(1, -(-rows // rows_per_block))
    if not live_rows:
        return 1.0
    swept = blocks * -np.expm1(-live_rows / blocks) / live_rows
    return float(min(1.0, swept + 1.0 / rows_per_block))


def log_disk_bytes(live_rows: int, rows_per_block: int) -> int:
    """`log.dat`'s size on disk at most."""
    return _ring_blocks(live_rows, rows_per_block) * 4096 if live_rows else 0


def _ring_blocks(live_rows: int, rows_per_block: int) -> int:
    return -(-int(_RING * live_rows) // rows_per_block)


class WriteLog:
    """Rows by global id appended to `path`; `home_order(gids)` -> their home slots (the sort
    key of a sweep), `write_home(gids, rows)` patches rows into their home blocks."""

    def __init__(
        self,
        path,
        live_rows: int,
        rows_per_block: int,
        row_floats: int,
        tier_id: bytes,
        home_order: Callable[[torch.Tensor], torch.Tensor],
        write_home: Callable[[torch.Tensor, torch.Tensor], None],
        **file_args,
    ) -> None:
        self.live_rows, self.rpb, self.row_floats = live_rows, rows_per_block, row_floats
        self.ring_blocks = _ring_blocks(live_rows, rows_per_block)
        self.ring_rows = self.ring_blocks * rows_per_block
        self.file = BlockFile(path, self.ring_blocks, create=True, tag=tier_id, **file_args)
        self.map = SlotMap(_MAP_ENTRIES_PER_ROW * live_rows, wide=True)
        self.home_order, self.write_home = home_order, write_home
        self.min_slice, self.slice_factor = MIN_SLICE, SLICE_FACTOR
        self.counts = dict.fromkeys(
            ("rows_logged", "blocks_logged", "rows_read", "blocks_read", "rows_swept",
             "rows_superseded", "sweeps", "full_ring_waits"), 0
        )  # fmt: skip
        self.reset()

    def reset(self) -> None:
        """Empty: every logged row is home (or never needed again)."""
        self.map.clear()
        self.head = self.tail = 0  # logical slots: next to write, oldest still in use
        self._sweep: tuple[torch.Tensor, torch.Tensor] | None = None
        self._pos = self._start = 0

    def close(self) -> None:
        self.file.close()

    def nbytes(self) -> int:
        return self.map.nbytes()

    @property
    def logged(self) -> int:
        """Rows the map points at (a row logged twice counts once)."""
        return int(self.map.items()[0].size)

    def locate(self, gids: torch.Tensor) -> torch.Tensor:
        """The log slot of each row's newest copy, -1 where it is not logged."""
        return self.map.get(gids)

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, int]:
        """([n, row floats] of the rows at logical `slots` (all in use), blocks read)."""
        phys = slots % self.ring_rows
        blocks = (phys // self.rpb).numpy()
        ub, pos = np.unique(blocks, return_inverse=True)
        rows = self._rows_view(self.file.read(ub))
        self.counts["rows_read"] += slots.numel()
        self.counts["blocks_read"] += ub.size
        return rows[torch.from_numpy(pos), phys % self.rpb], int(ub.size)

    def _rows_view(self, buf: np.ndarray) -> torch.Tensor:
        return block_rows(buf, self.rpb, self.row_floats)

    def append(self, gids: torch.Tensor, rows: torch.Tensor) -> None:
        """Log rows `gids` (unique) with their values `rows`; then a slice of the sweep."""
        most = (self.ring_blocks // 4) * self.rpb  # an append never needs more than the ring's rest
        for a in range(0, gids.numel(), most):
            self._append(gids[a : a + most], rows[a : a + most])
        self._advance(max(self.min_slice, int(self.slice_factor * gids.numel())))

    def _append(self, gids: torch.Tensor, rows: torch.Tensor) -> None:
        n = gids.numel()
        nb = -(-n // self.rpb)
        if self.head % self.ring_rows + nb * self.rpb > self.ring_rows:  # no wrap inside a write
            self.head += self.ring_rows - self.head % self.ring_rows
        while self.head + nb * self.rpb - self.tail > self.ring_rows:
            self.counts["full_ring_waits"] += 1
            self._advance(None)  # the ring is full: the sweep ends (or starts and ends) now
        first = self.head % self.ring_rows // self.rpb
        buf = aligned_blocks(nb)
        at = torch.arange(n)
        self._rows_view(buf)[at // self.rpb, at % self.rpb] = rows
        self.file.write(np.arange(first, first + nb), stamp(buf, 0, 0))
        slots = torch.arange(self.head, self.head + n)
        old = self.map.get(gids) >= 0
        if bool(old.any()):
            self.map.remove(gids[old])
        self.map.add(gids, slots)
        self.head += nb * self.rpb
        self.counts["rows_logged"] += n
        self.counts["blocks_logged"] += nb

    def _advance(self, rows: int | None) -> None:
        """Patch up to `rows` more of the sweep's rows home (None: all of them), starting a sweep
        when the rows written since the tail reach `live_rows`; the tail moves when one ends."""
        if self._sweep is None:
            if rows is not None and self.head - self.tail < self.live_rows:
                return
            gids, slots = self.map.items()
            if not gids.size:  # nothing to move: every slot before the head is dead
                self.tail = self.head
                return
            order = np.argsort(self.home_order(torch.from_numpy(gids)).numpy(), kind="stable")
            self._sweep = (torch.from_numpy(gids[order]), torch.from_numpy(slots[order]))
            self._pos, self._start = 0, self.head
            self.counts["sweeps"] += 1
        gids, slots = self._sweep
        end = gids.numel() if rows is None else min(gids.numel(), self._pos + rows)
        if end > self._pos:
            g, s = gids[self._pos : end], slots[self._pos : end]
            same = self.map.get(g) == s  # logged again since the sweep began: that copy stays
            self.counts["rows_superseded"] += int((~same).sum())
            g, s = g[same], s[same]
            if g.numel():
                self.write_home(g, self.read(s)[0])
                self.map.remove(g)
                self.counts["rows_swept"] += g.numel()
            self._pos = end
        if self._pos >= gids.numel():
            self._sweep = None
            self.tail = self._start
