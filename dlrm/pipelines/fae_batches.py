"""FAE's schedule applied to a training split: each epoch regrouped into hot and cold mini-batches.

The order (which inputs form which mini-batch, windows, interleave or block) is decided by
`embeddings.fae_scheduler` from a hot/cold mask; this file cuts the batches accordingly. Batch k
of an epoch depends only on the wrapped source's batches of k's window, so the regrouped epoch
is a deterministic function of (seed, epoch) and resumable at any batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embeddings.fae_scheduler import window_bounds, window_layout
from embeddings.kjt_ops import KJTSelector, concat_kjts


def concat_batches(parts: list[Batch]) -> Batch:
    """Batches joined along the batch dimension (features in the first one's key order)."""
    if len(parts) == 1:
        return parts[0]
    return Batch(
        dense_features=torch.cat([b.dense_features for b in parts]),
        sparse_features=concat_kjts([b.sparse_features for b in parts]),
        labels=torch.cat([b.labels for b in parts]),
    )


class BatchSelector:
    """Many subsets of one batch's inputs, each costing only its own lookups. An input is its
    label's rows of dense and sparse features: one for DLRM, ts_length + 1 for TBSM
    (sample-major, so input i is rows i * R ... i * R + R - 1)."""

    def __init__(self, batch: Batch) -> None:
        self.kjt = KJTSelector(batch.sparse_features)
        self.dense, self.labels = batch.dense_features, batch.labels
        self.rows_per_input = max(1, self.kjt.size // max(1, self.labels.numel()))

    def select(self, idx: np.ndarray) -> Batch:
        sel = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
        rows = sel
        if self.rows_per_input > 1:
            R = self.rows_per_input
            rows = (sel.unsqueeze(1) * R + torch.arange(R)).reshape(-1)
        return Batch(
            dense_features=self.dense[rows],
            sparse_features=self.kjt.select(rows),
            labels=self.labels[sel],
        )


class FAEBatchSource:
    """A training `BatchSource` regrouped by the FAE scheduler; `classify(kjt)` is the bool
    [batch] mask of all-hot inputs."""

    def __init__(
        self,
        source,
        classify: Callable[[KeyedJaggedTensor], torch.Tensor],
        switch_period: int,
        order: str = "interleave",
        num_batches: int = 0,
    ) -> None:
        self.source = source
        self.classify = classify
        self.switch_period = switch_period
        self.order = order
        self.batch_size = source.batch_size
        self.num_dense = source.num_dense
        self.table_sizes = source.table_sizes
        self.feature_names = source.feature_names
        self.num_batches = min(len(source), num_batches) if num_batches else len(source)
        window_bounds(self.num_batches, switch_period, order)  # validates

    def __len__(self) -> int:
        return self.num_batches

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        if not 0 <= start <= self.num_batches:
            raise IndexError(f"start batch {start} of {self.num_batches}")
        for ws, we in window_bounds(self.num_batches, self.switch_period, self.order):
            if we <= start:
                continue
            for j, batch in enumerate(self._window(epoch, ws, we)):
                if start <= ws + j < self.num_batches:
                    yield batch

    def batch(self, epoch: int, index: int) -> Batch:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} of {self.num_batches}")
        return next(self.batches(epoch, start=index))

    def _window(self, epoch: int, ws: int, we: int) -> Iterator[Batch]:
        src = self.source.batches(epoch, start=ws)
        parts = [next(src) for _ in range(we - ws)]
        size = int(parts[0].labels.numel())  # the source's batch (this rank's shard)
        joined = concat_batches(parts)
        del parts
        hot = self.classify(joined.sparse_features).numpy()
        selector = BatchSelector(joined)
        for _, idx in window_layout(hot, max(size, 1), self.order):
            yield selector.select(idx)
