"""The SSD tier's writes not stored yet, and its last few writes (embeddings/ssd/tier.py).

A write-back that found the tier held by a prefetch used to wait for it (its file reads and the
evictions its admissions cause: hundreds of milliseconds). Instead `WriteQueue.put` keeps the
rows and returns; the tier's next holder `take`s them and stores them before anything else, so
every read sees every write made before it began.

A staging's refresh re-reads rows written back after the staging began: the newest writes. The
queue remembers the last RECENT writes (ids sorted), and `recent` serves a read from them when
every row it asks for is there, without waiting for the tier. A row's value in the tier is its
last write, so these values are exact.
"""

from __future__ import annotations

import threading
from collections import deque

import torch

MAX_QUEUED = 8  # writes queued for the tier's next holder; one more waits for it
RECENT = 4  # writes remembered for reads that need only them (a staging's refresh)


Rows = tuple[torch.Tensor, ...]  # a write's rows in parts side by side (weights, state)


def joined(parts: Rows) -> torch.Tensor:
    """[n, row floats]: a write's parts side by side (the one part itself, not a copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class WriteQueue:
    """A write is its ids and its rows in parts (weights, state): the writer hands them over as
    it has them, and whoever stores them joins the parts (`joined`), off the writer's thread."""

    def __init__(self, row_floats: int) -> None:
        self.row_floats = row_floats
        self._lock = threading.Lock()
        self._queued: list[tuple[torch.Tensor, Rows]] = []
        self._recent: deque[tuple[torch.Tensor, Rows]] = deque(maxlen=RECENT)

    def put(self, ids: torch.Tensor, rows: Rows, queue: bool = True) -> bool:
        """Remember a write (and queue it: `queue`); True when the queue is full (the caller
        should store it now)."""
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            order = torch.argsort(ids)
            sorted_ids, sorted_rows = ids[order], tuple(p[order] for p in rows)
        else:
            sorted_ids, sorted_rows = ids, rows
        with self._lock:
            self._recent.append((sorted_ids, sorted_rows))
            if queue:
                self._queued.append((ids, rows))
            return len(self._queued) > MAX_QUEUED

    def take(self) -> list[tuple[torch.Tensor, Rows]]:
        """The queued writes, oldest first (the queue is left empty)."""
        with self._lock:
            queued, self._queued = self._queued, []
        return queued

    def forget(self) -> None:
        """The tier's rows changed otherwise (restored, started afresh): the recent writes no
        longer tell their values."""
        with self._lock:
            self._recent.clear()

    def recent(self, ids: torch.Tensor) -> torch.Tensor | None:
        """[n, row floats] rows `ids` if every one is in the last RECENT writes (their newest
        values), else None."""
        with self._lock:
            recent = list(self._recent)
        if not recent or not ids.numel():
            return None
        out = torch.empty(ids.numel(), self.row_floats)
        found = torch.zeros(ids.numel(), dtype=torch.bool)
        for gids, rows in reversed(recent):  # newest first
            if not gids.numel():  # a write of no rows (a step without cold rows) tells nothing
                continue
            at = torch.searchsorted(gids, ids).clamp(max=gids.numel() - 1)
            hit = (gids[at] == ids) & ~found
            src, col = at[hit], 0
            for part in rows:
                width = part.shape[1]
                out[hit, col : col + width] = part[src]
                col += width
            found |= hit
            if bool(found.all()):
                return out
        return None
