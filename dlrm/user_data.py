"""A user's own batches as the trainer's data: `DataSplits.from_batches(train=..., test=...,
table_sizes=...)` with any iterable of torchrec `Batch` per split (a list, a generator, a torch
DataLoader). The trainer asks a data source for `len()`, `batches(epoch, start)` and
`batch(epoch, index)` (data_pipeline/source.py), so that a resumed run replays exactly; a
`BatchList` gives that face to a sequence of batches."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from torchrec.datasets.utils import Batch

from dlrm.errors import ConfigError


class BatchList:
    """A `BatchSource` over a sequence of batches: the same batches in the same order every
    epoch. A sequence (`len` and `[i]`) is kept as it is; any other iterable is read once into a
    list, so it must fit in memory."""

    def __init__(self, batches: Iterable[Batch], what: str = "batches") -> None:
        self._batches = batches if isinstance(batches, Sequence) else list(batches)
        if not len(self._batches):
            raise ConfigError(f"{what}: no batches")
        first = self._batches[0]
        if not isinstance(first, Batch):
            raise ConfigError(f"{what}: expected torchrec Batch items, got {type(first).__name__}")
        self.batch_size = len(first.labels)
        self.num_dense = first.dense_features.shape[1]
        self.feature_names = list(first.sparse_features.keys())
        self.table_sizes: list[int] = []  # set by DataSplits.from_batches

    def __len__(self) -> int:
        return len(self._batches)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        for index in range(start, len(self)):
            yield self._batches[index]

    def batch(self, epoch: int, index: int) -> Batch:
        return self._batches[index]


def splits_from_batches(cls, train, test, table_sizes) -> object:
    """`DataSplits` of a user's training and test batches (every batch with the same dense
    width and sparse keys; `table_sizes[i]` rows for the i-th key)."""
    train_list, test_list = BatchList(train, "train"), BatchList(test, "test")
    for split in (train_list, test_list):
        split.table_sizes = [int(n) for n in table_sizes]
    if len(train_list.table_sizes) != len(train_list.feature_names):
        raise ConfigError(
            f"table_sizes: {len(train_list.table_sizes)} sizes for "
            f"{len(train_list.feature_names)} sparse features ({', '.join(train_list.feature_names)})"
        )
    if (test_list.num_dense, test_list.feature_names) != (
        train_list.num_dense, train_list.feature_names,
    ):  # fmt: skip
        raise ConfigError("test: its batches' dense width or sparse keys differ from train's")
    return cls(train=train_list, test=test_list, table_sizes=train_list.table_sizes,
               num_dense=train_list.num_dense, feature_names=train_list.feature_names)  # fmt: skip
