"""What the trainer asks of any dataset: a fixed number of batches per epoch, replayable from any
position, so that a resumed run sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from torchrec.datasets.utils import Batch


class BatchSource(Protocol):
    """A split of a dataset cut into batches.

    `batches(epoch, start)` yields batch `start`, `start + 1`, ... of `epoch`; `batch(epoch, index)`
    is one of them on its own. The order may depend on the epoch (seeded shuffling) but never on
    anything else, so it can be replayed.
    `rank`/`world_size` (given at construction) select a shard of every batch for data parallelism.
    """

    batch_size: int
    num_dense: int
    table_sizes: list[int]
    feature_names: list[str]

    def __len__(self) -> int:
        """Batches per epoch."""
        ...

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]: ...

    def batch(self, epoch: int, index: int) -> Batch: ...
