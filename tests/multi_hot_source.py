"""A test-local multi-hot BatchSource: a seeded one-hot source's batches expanded into bags of
several ids per feature, so every placement can be checked on what MLPerf's DLRM-DCNv2 trains
on without waiting for the data side's materialisation.

Each sample's bag for feature f holds its one-hot id first and `sizes[f] - 1` further ids drawn
from a Zipf law over the table (rank r -> row r - 1), so hot rows dominate: with a hot budget of
a part of the rows, some inputs have every id of every bag hot and some do not. A share of the
bags is empty (an empty bag pools to zeros; it counts as hot, stale, anything "every id" asks).
The expansion depends only on (seed, epoch, global batch index), never on the rank, so a
2-process run shards the very batches a 1-process run trains on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from data_pipeline.synthetic import PlantedWorld, SyntheticBatchSource, SyntheticConfig

SIZES = (60, 40, 500, 7)
BAG_SIZES = (3, 1, 2, 4)


def expand(
    kjt: KeyedJaggedTensor,
    bag_sizes: Sequence[int],
    table_sizes: Sequence[int],
    rng: np.random.Generator,
    zipf: float = 1.3,
    empty_share: float = 0.1,
) -> KeyedJaggedTensor:
    """A one-hot KJT's bags grown to `bag_sizes[f]` ids (its own id first), some emptied."""
    T, B = len(kjt.keys()), kjt.stride()
    one_hot = kjt.values().view(T, B).numpy()
    values, lengths = [], []
    for f in range(T):
        n = bag_sizes[f]
        extra = (rng.zipf(zipf, size=(B, n - 1)) - 1) % table_sizes[f]
        bags = np.concatenate([one_hot[f][:, None], extra], axis=1)  # [B, n]
        keep = rng.random(B) >= empty_share  # an empty bag: no id at all
        values.append(bags[keep].reshape(-1))
        lengths.append(np.where(keep, n, 0))
    return KeyedJaggedTensor(
        keys=list(kjt.keys()),
        values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
        lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int32)),
        stride=B,
    )


class MultiHotSource:
    """A BatchSource whose batches are `base`'s (a whole-batch, one-process source) expanded by
    `expand`, then cut to this rank's contiguous share of every batch."""

    def __init__(
        self, base, bag_sizes: Sequence[int], seed: int = 0, rank: int = 0, world_size: int = 1,
        empty_share: float = 0.1,
    ) -> None:  # fmt: skip
        if len(bag_sizes) != len(base.table_sizes):
            raise ValueError("one bag size per feature")
        self.base, self.bag_sizes, self.seed = base, list(bag_sizes), seed
        self.rank, self.world_size, self.empty_share = rank, world_size, empty_share
        self.batch_size = base.batch_size  # the global batch, as SyntheticBatchSource's
        self.num_dense = base.num_dense
        self.table_sizes = list(base.table_sizes)
        self.feature_names = list(base.feature_names)

    def __len__(self) -> int:
        return len(self.base)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        for i in range(start, len(self)):
            yield self.batch(epoch, i)

    def batch(self, epoch: int, index: int) -> Batch:
        b = self.base.batch(epoch, index)
        rng = np.random.default_rng([self.seed, epoch, index])
        kjt = expand(b.sparse_features, self.bag_sizes, self.table_sizes, rng,
                     empty_share=self.empty_share)  # fmt: skip
        if self.world_size == 1:
            return Batch(dense_features=b.dense_features, sparse_features=kjt, labels=b.labels)
        n = self.batch_size // self.world_size
        sel = torch.arange(self.rank * n, (self.rank + 1) * n)
        from embeddings.kjt_ops import KJTSelector

        return Batch(
            dense_features=b.dense_features[sel],
            sparse_features=KJTSelector(kjt).select(sel),
            labels=b.labels[sel],
        )


def multi_hot_splits(
    table_sizes: Sequence[int] = SIZES,
    bag_sizes: Sequence[int] = BAG_SIZES,
    *,
    batch_size: int = 32,
    steps: int = 200,
    test_batches: int = 4,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    empty_share: float = 0.1,
):
    """`DataSplits` of multi-hot train and test batches from the planted synthetic world."""
    from dlrm.data import DataSplits

    world = PlantedWorld(SyntheticConfig(table_sizes=list(table_sizes), zipf_alpha=1.1, seed=seed))

    def source(split: str, batches: int) -> MultiHotSource:
        base = SyntheticBatchSource(world, split, batch_size, batches)
        return MultiHotSource(base, bag_sizes, seed + (split == "test"), rank, world_size,
                              empty_share)  # fmt: skip

    train, test = source("train", steps), source("test", test_batches)
    return DataSplits(train, test, list(table_sizes), world.cfg.num_dense, train.feature_names)


def ids_per_input(batch: Batch) -> float:
    """Mean ids per input over all features (one-hot: the number of features)."""
    return batch.sparse_features.values().numel() / max(1, batch.labels.numel())
