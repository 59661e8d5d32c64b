"""The SSD tier's layout: the slot of `rows.dat` each global row lives in, chosen from the run's
access profile so that rows read together share 4 KiB blocks (issue 47; Bandana, SysML 2019,
does the same with hypergraph partitioning of the access trace).

In row-id order (the identity layout, every tier before this one) a block holds rows that are
neighbours by id, which hashed ids make strangers: each missed 64-byte row costs a block of its
own (read amplification 64 at dim 16). The profile layout puts first the rows the profile saw,
most counted first across all tables (the rows of one block are then of like popularity: the
warm rows just past the cache, which every mini-batch misses some of, share blocks), and among
rows of equal count (most of the tail) the rows of one profiled input together (ordered by the
first kept input that read them: that input's rows of every table are adjacent). Then every
other row, in row-id order. Frequency order with a co-access tie-break rather than a partition
of the co-access graph: popularity is the one signal that carries from a sample to every later
batch of any data set, it costs one sort, and the graph of a sample's inputs would cost memory
and minutes at the run's start for what only correlated ids can give back.

The layout is a permutation of the global rows, stored sparsely: `placed`, the profiled rows'
global ids in slot order (slots 0 .. P-1); row g not placed is at slot P + g - (placed rows
below g). 12 bytes per placed row while the rows fit int32 (the file, `placed` and its sorted
copy with slots), nothing per other row. The hot rows (the device tier's) are not placed: the
tier never reads them.

On disk: `layout.npy` (the `placed` array, no pickle) in the tier directory, recorded in
`tier.json` by size and CRC-32 (hybrid_dlrm/common/manifest.py); a tier opens it only when it
matches, and a `placed` that is not a set of distinct rows of the tier is refused. A tier written
without one (older runs, or `--scm-layout identity`) is the identity.
"""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np

from embeddings.errors import ScmError
from hybrid_dlrm.common.atomic import atomic_write
from hybrid_dlrm.common.manifest import file_record, record_problem

LAYOUT_FILE = "layout.npy"
LAYOUTS = ("profile", "identity")
LAYOUT_BYTES_PER_ROW = 12  # int32 rows: `placed`, its sorted copy and their slots


@numba.njit(cache=True, nogil=True)
def _unplaced_rows(placed_sorted, js):
    """The j-th row (in id order) that is not placed, for each j of `js` (< 0: unused): j plus
    the placed rows below it, those with at most j unplaced rows below them
    (`placed_sorted[k] - k`, non-decreasing, found by bisection without an array of it)."""
    out = np.empty(js.size, np.int64)
    n = placed_sorted.size
    for i in range(js.size):
        j = js[i]
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if placed_sorted[mid] - mid <= j:
                lo = mid + 1
            else:
                hi = mid
        out[i] = j + lo
    return out


class RowLayout:
    """Global row id <-> slot in the tier file: `placed` rows first, in that order, then the
    others in id order."""

    def __init__(self, placed: np.ndarray, total_rows: int) -> None:
        self.total_rows = int(total_rows)
        dtype = np.int32 if self.total_rows < 2**31 else np.int64
        self.placed = np.ascontiguousarray(placed, dtype=dtype)  # slot -> row, slots < P
        order = np.argsort(self.placed, kind="stable")
        self._sorted = self.placed[order]  # placed rows, ascending
        self._slot = order.astype(dtype)  # the slot of each of them

    @classmethod
    def identity(cls, total_rows: int) -> RowLayout:
        return cls(np.zeros(0, np.int64), total_rows)

    @property
    def kind(self) -> str:
        return "profile" if self.placed.size else "identity"

    @property
    def num_placed(self) -> int:
        return int(self.placed.size)

    def nbytes(self) -> int:
        return self.placed.nbytes + self._sorted.nbytes + self._slot.nbytes

    def slots(self, rows: np.ndarray) -> np.ndarray:
        """The slot of each global row (int64)."""
        rows = np.asarray(rows, dtype=np.int64)
        p = self.placed.size
        if not p:
            return rows
        below = np.searchsorted(self._sorted, rows)  # placed rows below each
        at = np.minimum(below, p - 1)
        placed = self._sorted[at] == rows
        return np.where(placed, self._slot[at].astype(np.int64), p + rows - below)

    def rows(self, slots: np.ndarray) -> np.ndarray:
        """The global row at each slot (int64): `slots`' inverse."""
        slots = np.asarray(slots, dtype=np.int64)
        p = self.placed.size
        if not p:
            return slots
        rest = _unplaced_rows(self._sorted, slots - p)
        return np.where(slots < p, self.placed[np.clip(slots, 0, p - 1)].astype(np.int64), rest)

    def blocks(self, rows: np.ndarray, rows_per_block: int) -> np.ndarray:
        """The block of each global row."""
        return self.slots(rows) // rows_per_block

    # --- the file ------------------------------------------------------------------------------

    def save(self, directory: Path) -> dict:
        """`layout.npy` in `directory`, and its record for tier.json."""
        path = Path(directory) / LAYOUT_FILE
        with atomic_write(path) as f:
            np.save(f, self.placed, allow_pickle=False)
        return {"kind": self.kind, "file": LAYOUT_FILE, "rows": self.num_placed,
                **file_record(path)}  # fmt: skip

    @classmethod
    def open(cls, directory: Path, record: dict | None, total_rows: int) -> RowLayout:
        """The layout tier.json's `record` names (None or identity: the identity), verified:
        edited, cut or swapped is one line, never rows read from the wrong slots."""
        if record is None or record.get("kind") == "identity":
            return cls.identity(total_rows)
        path = Path(directory) / LAYOUT_FILE
        manifest = Path(directory) / "tier.json"
        if record.get("kind") != "profile" or record.get("file") != LAYOUT_FILE:
            raise ScmError(f"{manifest}: `layout` is not a layout record ({record!r:.80})")
        if problem := record_problem(path, record, source="tier.json"):
            raise ScmError(
                f"{path}: the tier's row layout does not match tier.json ({problem}): its rows "
                "cannot be found without it (restore the file, or delete the directory to start "
                "the tier afresh)"
            )
        try:
            placed = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ScmError(f"{path}: not a readable row layout ({e})") from None
        if placed.dtype not in (np.int32, np.int64) or placed.ndim != 1:
            raise ScmError(
                f"{path}: a row layout is 1-D int32/int64, got {placed.dtype} {placed.shape}"
            )
        if placed.size != record.get("rows"):
            raise ScmError(f"{path}: {placed.size} rows, tier.json says {record.get('rows')}")
        if placed.size and (
            int(placed.min()) < 0
            or int(placed.max()) >= total_rows
            or np.unique(placed).size != placed.size
        ):
            raise ScmError(f"{path}: not distinct rows of the tier's {total_rows}")
        return cls(placed, total_rows)


_TOP_LEVEL = 1 << 16  # counts at or above it are one level


def count_levels(counts: list[np.ndarray]) -> np.ndarray:
    """[k] = the rows counted at least k times, k = 0 .. 2**16 (one pass over every row's count:
    a planner weighing several layouts of one profile makes it once)."""
    hist = sum(np.bincount(np.minimum(c, _TOP_LEVEL), minlength=_TOP_LEVEL + 1) for c in counts)
    return np.cumsum(hist[::-1])[::-1]


def profile_layout(
    counts: list[np.ndarray],
    sizes: list[int],
    hot_rows: np.ndarray | None = None,
    sample_lengths: np.ndarray | None = None,
    sample_values: np.ndarray | None = None,
    min_count: int = 1,
    max_rows: int | None = None,
    levels: np.ndarray | None = None,
) -> RowLayout:
    """The profile layout (module docstring) of tables `sizes` from an access profile's per-table
    `counts` and its kept inputs (`sample_lengths` [T, n], `sample_values` table-major); rows in
    `hot_rows` (sorted global ids: the device tier's) and rows counted under `min_count` times are
    not placed, nor more than `max_rows` (the most counted kept). `levels`: `count_levels(counts)`
    where made already."""
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    if max_rows is not None:  # the count the placed rows need at least, found without
        # gathering every seen row (at Terabyte scale 16 bytes each, for rows left out)
        top = _TOP_LEVEL
        above = count_levels(counts) if levels is None else levels
        extra = 0 if hot_rows is None else int(hot_rows.size)
        fits = np.flatnonzero(above <= max_rows + extra)
        # the count whose rows overflow the budget is gathered too (sorted, then cut): the
        # level above it alone could be empty (every such row hot)
        level = int(fits[0]) - 1 if fits.size else top
        min_count = max(min_count, level)
    rows = np.concatenate([np.flatnonzero(c >= min_count) + b for c, b in zip(counts, base)])
    count = np.concatenate([c[c >= min_count] for c in counts]).astype(np.int64)
    if hot_rows is not None and hot_rows.size and rows.size:
        at = np.minimum(np.searchsorted(hot_rows, rows), hot_rows.size - 1)
        cold = hot_rows[at] != rows
        rows, count = rows[cold], count[cold]
    first = np.full(rows.size, np.iinfo(np.int64).max)  # the first kept input reading each row
    if sample_lengths is not None and sample_values is not None and sample_lengths.size:
        lengths = np.asarray(sample_lengths, dtype=np.int64)
        n = lengths.shape[1]
        table = np.repeat(np.arange(lengths.shape[0]), lengths.sum(axis=1))
        which = np.concatenate(
            [np.repeat(np.arange(n), lengths[t]) for t in range(lengths.shape[0])]
        )
        g = np.asarray(sample_values, dtype=np.int64) + base[table]
        order = np.lexsort((which, g))
        g, which = g[order], which[order]
        head = np.flatnonzero(np.diff(g, prepend=-1) != 0)  # each row's first (earliest) input
        g, which = g[head], which[head]
        at = np.minimum(np.searchsorted(rows, g), max(rows.size - 1, 0))
        if rows.size:
            hit = rows[at] == g
            first[at[hit]] = which[hit]
    placed = rows[np.lexsort((rows, first, -count))]
    return RowLayout(placed[:max_rows], int(sum(sizes)))


def plan_layout(
    profile, plan, max_rows: int | None = None, levels: np.ndarray | None = None
) -> RowLayout:
    """The profile layout of `plan`'s tables from `profile` (an AccessProfile), its device
    tier's rows left out, at most `max_rows` placed (`levels`: as `profile_layout`'s)."""
    sizes = [int(n) for n in profile.table_sizes]
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    device = plan.tier("device")
    hot = np.concatenate([device.held_ids(t).astype(np.int64) + base[t] for t in range(len(sizes))])
    return profile_layout(
        profile.counts, sizes, np.sort(hot), profile.sample_lengths, profile.sample_values,
        max_rows=max_rows, levels=levels,
    )  # fmt: skip


def layout_rows(cache_bytes: int) -> int:
    """The rows a profile layout places at most beside a row cache of `cache_bytes`: its
    bytes (12 a row) at most a quarter of the cache's. The rows worth packing are those just
    past the cache, which batches miss together; rows the profile saw once or twice rarely
    share a block read (at Terabyte scale they are most of the profile)."""
    return max(0, int(cache_bytes)) // 4 // LAYOUT_BYTES_PER_ROW
