"""Raw categorical values (32-bit hex) -> embedding row ids, in one of two modes.

- hash (`--max-ind-range M`): id = value % M, as the reference does; an empty field counts as
  value 0 (also as the reference), so it shares id 0. Every table has M rows. No dictionary.
- frequency (`--frequency-threshold T`): per feature, values are counted over the labelled
  days (after down-sampling, i.e. over the rows actually kept; the reference counts all days
  too). Ids: 0 = empty field, 1 = every value seen fewer than T times or never seen (e.g. only
  in the unlabelled test.txt), then 2, 3, ... for the remaining values by descending count,
  ties by ascending value. So ids are deterministic and the hottest rows come first, which the
  placement code likes. A table has 2 + (number of values seen at least T times) rows.

The counts are merged from per-block `np.unique` results with a policy that keeps the total
merge work O(n log n); their memory is proportional to the distinct values (16 bytes each).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hybrid_dlrm.common.atomic import atomic_write

MISSING_ID = 0
RARE_ID = 1
FIRST_FREQUENT_ID = 2


def hash_ids(cats: np.ndarray, max_ind_range: int, dtype: np.dtype) -> np.ndarray:
    """value % M, an empty field (negative marker) as value 0."""
    values = np.maximum(cats, 0)
    # numpy's integer // by a scalar is fast (libdivide); its % is several times slower.
    ids = values - (values // max_ind_range) * max_ind_range
    return ids.astype(dtype, copy=False)


def _reduce(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum counts of equal values; returns sorted unique values."""
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    if len(values) == 0:
        return values, counts
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[starts], np.add.reduceat(counts, starts)


class FrequencyCounter:
    """Per-feature value counts, fed with (unique values, counts) pairs."""

    def __init__(self, num_features: int):
        self.num_features = num_features
        self._merged = [(np.empty(0, np.int64), np.empty(0, np.int64)) for _ in range(num_features)]
        self._pending: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(num_features)]
        self._pending_len = [0] * num_features

    def add(self, feature: int, values: np.ndarray, counts: np.ndarray) -> None:
        self._pending[feature].append((values, counts))
        self._pending_len[feature] += len(values)
        # Merge when the pending pairs are as big as what is merged: amortised O(n log n).
        if self._pending_len[feature] > max(1 << 20, len(self._merged[feature][0])):
            self._merge(feature)

    def _merge(self, feature: int) -> None:
        if not self._pending[feature]:
            return
        parts = [self._merged[feature], *self._pending[feature]]
        self._merged[feature] = _reduce(
            np.concatenate([v for v, _ in parts]), np.concatenate([c for _, c in parts])
        )
        self._pending[feature] = []
        self._pending_len[feature] = 0

    def update(self, other: FrequencyCounter) -> None:
        for f in range(self.num_features):
            self.add(f, *other.result(f))

    def result(self, feature: int) -> tuple[np.ndarray, np.ndarray]:
        """(sorted distinct values, their counts); the empty-field marker is included."""
        self._merge(feature)
        return self._merged[feature]

    def save(self, path: Path) -> None:
        arrays = {}
        for f in range(self.num_features):
            arrays[f"values_{f}"], arrays[f"counts_{f}"] = self.result(f)
        with atomic_write(path) as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path, num_features: int) -> FrequencyCounter:
        counter = cls(num_features)
        with np.load(path, allow_pickle=False) as z:
            for f in range(num_features):
                counter._merged[f] = (z[f"values_{f}"], z[f"counts_{f}"])
        return counter


def build_vocabulary(
    values: np.ndarray, counts: np.ndarray, threshold: int
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Frequent values in id order (id = FIRST_FREQUENT_ID + position) with their counts,
    and a summary (missing and rare row counts) for meta.json."""
    present = values >= 0
    frequent = present & (counts >= threshold)
    fv, fc = values[frequent], counts[frequent]
    order = np.lexsort((fv, -fc))  # descending count, then ascending value
    summary = {
        "frequent_values": int(frequent.sum()),
        "rare_values": int((present & ~frequent).sum()),
        "rare_rows": int(counts[present & ~frequent].sum()),
        "missing_rows": int(counts[~present].sum()),
    }
    return fv[order], fc[order], summary


class Vocabulary:
    """The frequency-mode id maps of all features, stored as .npy files in a directory.

    Per feature f: `cat_f.values.npy` / `cat_f.counts.npy` (frequent values and counts in id
    order, for people and tools) and `cat_f.sorted_values.npy` / `cat_f.sorted_ids.npy` (the same,
    sorted by value, memory-mapped by the workers for `searchsorted`).
    """

    def __init__(self, directory: Path, num_features: int):
        self.directory = Path(directory)
        self.num_features = num_features
        self._maps: list[tuple[np.ndarray, np.ndarray]] | None = None

    @staticmethod
    def write(
        directory: Path, counter: FrequencyCounter, threshold: int
    ) -> tuple[list[int], list[dict]]:
        """Build and save every feature's map; returns (table sizes, per-feature summaries)."""
        directory.mkdir(parents=True, exist_ok=True)
        sizes, summaries = [], []
        for f in range(counter.num_features):
            ordered, counts, summary = build_vocabulary(*counter.result(f), threshold)
            by_value = np.argsort(ordered, kind="stable")
            ids = (by_value + FIRST_FREQUENT_ID).astype(np.int64)
            for name, arr in (
                ("values", ordered),
                ("counts", counts),
                ("sorted_values", ordered[by_value]),
                ("sorted_ids", ids),
            ):
                np.save(directory / f"cat_{f}.{name}.npy", arr)
            sizes.append(FIRST_FREQUENT_ID + len(ordered))
            summaries.append(summary)
        (directory / "vocabulary.json").write_text(
            json.dumps({"threshold": threshold, "table_sizes": sizes}) + "\n"
        )
        return sizes, summaries

    @staticmethod
    def write_contiguous(
        directory: Path, counter: FrequencyCounter
    ) -> tuple[list[int], list[dict]]:
        """Hash mode renumbered (the reference's and MLPerf's tables): each feature's distinct
        value % M, counted over the labelled days, gets id = its rank by value; a value not seen
        there (an unlabelled file, serving) shares the row of value 0, or row 0. Returns (table
        sizes, per-feature summaries)."""
        directory.mkdir(parents=True, exist_ok=True)
        sizes, summaries = [], []
        for f in range(counter.num_features):
            values, counts = counter.result(f)  # sorted distinct, all >= 0 (hashed)
            ids = np.arange(len(values), dtype=np.int64)
            for name, arr in (("values", values), ("counts", counts), ("sorted_values", values),
                              ("sorted_ids", ids)):  # fmt: skip
                np.save(directory / f"cat_{f}.{name}.npy", arr)
            sizes.append(max(1, len(values)))  # a feature never seen still has its row 0
            summaries.append({"distinct_values": int(len(values)), "rows": int(counts.sum())})
        (directory / "vocabulary.json").write_text(
            json.dumps({"contiguous": True, "table_sizes": sizes}) + "\n"
        )
        return sizes, summaries

    def _load(self) -> list[tuple[np.ndarray, np.ndarray]]:
        if self._maps is None:
            self._maps = [
                (
                    np.load(self.directory / f"cat_{f}.sorted_values.npy", mmap_mode="r"),
                    np.load(self.directory / f"cat_{f}.sorted_ids.npy", mmap_mode="r"),
                )
                for f in range(self.num_features)
            ]
        return self._maps

    def ids(self, cats: np.ndarray, dtype: np.dtype, renumbered: bool = False) -> np.ndarray:
        """Raw values [n, features] (negative = empty) -> ids [n, features]; `renumbered`: a
        `write_contiguous` vocabulary, and `cats` hashed (value % M) already."""
        out = np.empty(cats.shape, dtype=dtype)
        # renumbered: an unseen value takes row 0, which is value 0's wherever value 0 was seen
        unseen = 0 if renumbered else RARE_ID
        for f, (values, ids) in enumerate(self._load()):
            # Look up each distinct value once, in sorted order: far fewer and far more
            # cache-friendly binary searches in a large memory-mapped map.
            distinct, inverse = np.unique(cats[:, f], return_inverse=True)
            if len(values):
                pos = np.minimum(np.searchsorted(values, distinct), len(values) - 1)
                mapped = np.where(values[pos] == distinct, ids[pos], unseen)
            else:
                mapped = np.full(len(distinct), unseen, dtype=np.int64)
            mapped[distinct < 0] = MISSING_ID  # raw empty fields (hashed values are >= 0)
            out[:, f] = mapped[inverse]
        return out
