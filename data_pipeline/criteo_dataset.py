"""Batches from a preprocessed Criteo directory: memory-mapped columns -> torchrec Batches.

A split (train / val / test / inference) is a list of segments (part, start, stop) from
meta.json, seen as one virtual array of rows. Batch k of an epoch covers virtual positions
[k*B, (k+1)*B); `randomize` maps positions to rows:

- "none": in file order, across day files;
- "day": days in order, rows shuffled within each day (segment);
- "total": rows shuffled across the whole split.

Shuffles are keyed Feistel permutations (permutation.py) of seed and epoch, so a batch depends
only on (seed, epoch, index): any batch can be rebuilt directly, which is what resuming a run
needs, and memory does not grow with the split. With `world_size` > 1 every global batch is cut
into `world_size` contiguous shards and rank r gets shard r.

Building a batch is a few numpy slices or gathers per day file (no per-sample Python); a
background thread builds the next batches while the caller trains on the current one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .criteo_directory import CriteoDataset
from .errors import DataError
from .permutation import FeistelPermutation, derive_key
from .synthetic import bags_kjt

if TYPE_CHECKING:
    from .multi_hot import BagSpec, MultiHotDataset

RANDOMIZE = ("none", "day", "total")


class CriteoBatchSource:
    """A `BatchSource` over one split of a preprocessed Criteo directory.

    batch_size is the global batch; with world_size > 1 each rank gets batch_size / world_size
    rows of every batch (the last, short batch is shared as evenly as possible).
    """

    num_dense: int

    def __init__(
        self,
        data: str | Path | CriteoDataset,
        split: str = "train",
        batch_size: int = 128,
        *,
        randomize: str = "none",
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 8,
        threads: int = 1,
        index_dtype: torch.dtype = torch.int64,
        bags: MultiHotDataset | BagSpec | None = None,
    ):
        """`bags`: the multi-hot bags materialised from this dataset (data_pipeline/multi_hot.py)
        replace its one-hot ids, or a BagSpec makes them from the ids as each batch is loaded;
        labels and dense features still come from here."""
        self.dataset = data if isinstance(data, CriteoDataset) else CriteoDataset(data)
        if randomize not in RANDOMIZE:
            raise DataError(
                f"--data-randomize: expected one of {', '.join(RANDOMIZE)}, got {randomize!r}"
            )
        if batch_size <= 0:
            raise DataError(f"--mini-batch-size: expected a positive number, got {batch_size}")
        if world_size <= 0 or not 0 <= rank < world_size:
            raise DataError(
                f"rank {rank} / world size {world_size}: expected 0 <= rank < world size"
            )
        if batch_size % world_size:
            raise DataError(
                f"--mini-batch-size {batch_size}: must be a multiple of the world size {world_size}"
            )
        self.split = split
        self.batch_size = batch_size
        self.randomize = randomize
        self.seed = seed
        self.drop_last = drop_last
        self.rank, self.world_size = rank, world_size
        self.prefetch = prefetch
        self.threads = threads
        self.index_dtype = index_dtype
        self.num_dense = self.dataset.num_dense
        self.table_sizes = self.dataset.table_sizes
        self.feature_names = self.dataset.feature_names
        self._segments = self.dataset.segments(split)
        sizes = np.array([stop - start for _, start, stop in self._segments], dtype=np.int64)
        self._seg_starts = np.concatenate(([0], np.cumsum(sizes)))
        self.num_samples = int(self._seg_starts[-1])
        # plain ndarray views of the memmaps: same pages, without np.memmap's per-call overhead
        self._columns = [
            tuple(None if c is None else np.asarray(c) for c in self.dataset.columns(part))
            for part, _, _ in self._segments
        ]
        self.has_labels = all(c[0] is not None for c in self._columns)
        self._values_dtype = np.int64 if index_dtype == torch.int64 else np.int32
        self.bags = bags
        self._make_bags = bags if bags is not None and not bags.materialised else None
        if bags is not None:
            if bags.table_sizes != self.table_sizes:
                raise DataError(
                    f"--multi-hot-sizes: the bags' tables are not {self.dataset.directory}'s"
                )
        if bags is not None and self._make_bags is None:
            # the bags stand in for the sparse column: same parts, same rows
            self._columns = [
                (lab, den, bags.values(part))
                for (lab, den, _), (part, _, _) in zip(self._columns, self._segments)
            ]
        self._cache_lock = threading.Lock()
        self._cache: tuple[int, int, int, np.ndarray] | None = None

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    # --- which rows ------------------------------------------------------------------------------

    _WINDOW = 64  # batches whose rows are computed together (amortises numpy call overhead)

    def _local_range(self, index: int) -> tuple[int, int]:
        """Virtual positions of this rank's shard of global batch `index`."""
        lo = index * self.batch_size
        size = min(self.batch_size, self.num_samples - lo)
        per, extra = divmod(size, self.world_size)
        start = lo + self.rank * per + min(self.rank, extra)
        return start, start + per + (1 if self.rank < extra else 0)

    def _permuted(self, epoch: int, lo: int, hi: int) -> np.ndarray:
        """Rows at virtual positions [lo, hi) under this epoch's shuffle."""
        positions = np.arange(lo, hi, dtype=np.int64)
        if self.randomize == "total":
            return FeistelPermutation(self.num_samples, derive_key(self.seed, epoch))(positions)
        seg = np.searchsorted(self._seg_starts, positions, side="right") - 1
        out = np.empty_like(positions)
        for s in np.unique(seg):
            sel = seg == s
            base = int(self._seg_starts[s])
            size = int(self._seg_starts[s + 1]) - base
            perm = FeistelPermutation(size, derive_key(self.seed, epoch, int(s) + 1))
            out[sel] = base + perm(positions[sel] - base)
        return out

    def rows(self, epoch: int, index: int) -> np.ndarray:
        """Split-wide row numbers (0 .. num_samples-1) of this rank's part of batch `index`.

        Shuffled batches come sorted by row: the order inside a batch does not matter to
        training, and sorted gathers from the memory-mapped files are faster."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        lo, hi = self._local_range(index)
        if self.randomize == "none":
            return np.arange(lo, hi, dtype=np.int64)
        window = index // self._WINDOW
        with self._cache_lock:  # one thread computes a window, the others wait and reuse it
            cached = self._cache
            if cached is None or cached[:2] != (epoch, window):
                w_lo = window * self._WINDOW * self.batch_size
                w_hi = min(self.num_samples, w_lo + self._WINDOW * self.batch_size)
                cached = self._cache = (epoch, window, w_lo, self._permuted(epoch, w_lo, w_hi))
        return np.sort(cached[3][lo - cached[2] : hi - cached[2]])

    # --- building a batch ------------------------------------------------------------------------

    def batch(self, epoch: int, index: int) -> Batch:
        rows = self.rows(epoch, index)
        n = len(rows)
        dense = np.empty((n, self.num_dense), dtype=np.float32)
        # one-hot: [tables, n]; with bags: [sum of bag sizes, n], table t's ids in its rows
        ids_per_sample = (
            len(self.feature_names)
            if self.bags is None or self._make_bags
            else int(sum(self.bags.sizes))
        )
        values = np.empty((ids_per_sample, n), dtype=self._values_dtype)
        labels = np.empty(n, dtype=np.float32)
        if not self.has_labels:
            labels.fill(np.nan)  # unlabelled (inference) data: never silently a 0 label
        # rows are sorted, so each day file touched supplies one contiguous run of the batch
        bounds = np.searchsorted(rows, self._seg_starts)
        for s in range(len(self._segments)):
            a, b = int(bounds[s]), int(bounds[s + 1])
            if a == b:
                continue
            lab, den, spa = self._columns[s]
            offset = self._segments[s][1] - int(self._seg_starts[s])
            if self.randomize == "none":
                lo = int(rows[a]) + offset
                sel = slice(lo, lo + b - a)
                dense[a:b] = den[sel]
                values[:, a:b] = spa[sel].T
                if lab is not None:
                    labels[a:b] = lab[sel]
            else:
                file_rows = rows[a:b] + offset
                np.take(den, file_rows, axis=0, out=dense[a:b])
                values[:, a:b] = np.take(spa, file_rows, axis=0).T
                if lab is not None:
                    labels[a:b] = np.take(lab, file_rows)
        if self._make_bags is not None:
            ids = self._make_bags.bags(values.T, parallel=False).T
            kjt = bags_kjt(self.feature_names, ids, np.array(self._make_bags.sizes))
        elif self.bags is not None:
            kjt = bags_kjt(self.feature_names, values, self.bags.sizes)
        else:
            kjt = KeyedJaggedTensor(
                keys=self.feature_names,
                values=torch.from_numpy(values.reshape(-1)),
                # numpy fills this faster than torch.ones, which wakes torch's thread pool
                lengths=torch.from_numpy(np.ones(values.size, dtype=np.int32)),
            )
        return Batch(
            dense_features=torch.from_numpy(dense),
            sparse_features=kjt,
            labels=torch.from_numpy(labels),
        )

    # --- iteration with prefetch -----------------------------------------------------------------

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        """Batches start, start+1, ... of `epoch`, built ahead by background threads.

        Up to `prefetch` batches are built ahead by `threads` threads and yielded in order, so
        the sequence is the same as without prefetching. One thread is the default: on a
        2-core machine shared with training, more threads fight over the GIL and cores (a
        second thread halved the unshuffled rate in measurements) and gain little for
        shuffled reads."""
        if not 0 <= start <= len(self):
            raise IndexError(f"start batch {start} of {len(self)}")
        if self.prefetch <= 0:
            for i in range(start, len(self)):
                yield self.batch(epoch, i)
            return
        pool = ThreadPoolExecutor(
            max_workers=max(1, self.threads), thread_name_prefix="criteo-batch"
        )
        pending: deque[Future] = deque()
        try:
            nxt = start
            while nxt < len(self) or pending:
                while nxt < len(self) and len(pending) < self.prefetch:
                    pending.append(pool.submit(self.batch, epoch, nxt))
                    nxt += 1
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
