"""Batches from a preprocessed Taobao window directory (see taobao.py): mmapped columns -> Batch.

Two layouts of the same samples:

- `sequence` (TBSM): every sample is T+1 steps (T history events, oldest first, then the
  candidate). The KeyedJaggedTensor has keys `user`, `item`, `category` and batch dimension
  B*(T+1), one id per bag, sample-major: bag b*(T+1) + j is step j of sample b. So every
  history lookup is in the KJT, and anything that reads KJTs (an access profiler, a placement
  planner, a hot/cold splitter) counts each of them; the user id is repeated in all T+1 steps
  because the model looks it up T+1 times. `dense_features` is [B*(T+1), 1]: the position
  j / (T+1) of each step. `labels` is [B].
- `candidate` (the DLRM baseline): only the candidate step: KJT batch dimension B, dense [B, 1]
  (the candidate's position T / (T+1), a constant), labels [B].

Shuffling, replay from any batch and rank sharding work as in the Criteo source: batch k of an
epoch is the positions [k*B, (k+1)*B) of a keyed Feistel permutation of the split's rows, so a
batch depends only on (seed, epoch, k).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from .errors import DataError, numpy_failure
from .npy_stream import check_file, first_id_outside
from .permutation import FeistelPermutation, derive_key
from .taobao import COLUMNS, SPLITS, load_taobao_meta

LAYOUTS = ("sequence", "candidate")


class TaobaoDataset:
    """An opened directory: meta.json plus lazily memory-mapped columns per split."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.meta = load_taobao_meta(self.directory)
        self.table_sizes: list[int] = list(self.meta["table_sizes"])
        self.feature_names: list[str] = list(self.meta["feature_names"])
        self.ts_length: int = int(self.meta["ts_length"])
        self._columns: dict[str, dict[str, np.ndarray]] = {}

    def columns(self, split: str) -> dict[str, np.ndarray]:
        if split not in SPLITS:
            raise DataError(f"{self.directory}: no split {split!r} (it has {', '.join(SPLITS)})")
        if split not in self._columns:
            rows = int(self.meta["splits"][split]["rows"])
            cols = {}
            for c in COLUMNS:
                path = self.directory / f"{split}.{c}.npy"
                try:
                    arr = np.load(path, mmap_mode="r", allow_pickle=False)
                except (OSError, ValueError) as e:
                    raise DataError(f"{path}: cannot be read ({numpy_failure(e)})") from None
                if arr.shape[0] != rows:
                    raise DataError(f"{path}: {arr.shape[0]} rows, meta.json says {rows}")
                cols[c] = arr
            for c in ("items", "categories"):
                if cols[c].shape[1:] != (self.ts_length + 1,):
                    raise DataError(
                        f"{self.directory}/{split}.{c}.npy: expected {self.ts_length + 1} steps per row"
                    )
            self._verify(split, cols)
            self._columns[split] = cols
        return self._columns[split]

    def _verify(self, split: str, cols: dict[str, np.ndarray]) -> None:
        """Before a split's first use in a process: each column file's CRC-32 against the one
        preprocessing recorded, and every id below its table's size (as CriteoDataset does)."""
        for c, record in self.meta["splits"][split].get("files", {}).items():
            problem = check_file(self.directory / f"{split}.{c}.npy", record, full=True)
            if problem:
                raise DataError(
                    f"{self.directory}: {problem}: it changed after preprocessing; "
                    "delete the directory and preprocess again"
                )
        for column, table in (("users", "user"), ("items", "item"), ("categories", "category")):
            size = self.table_sizes[self.feature_names.index(table)]
            bad = first_id_outside(cols[column], size)
            if bad is not None:
                row, step = bad
                value = int(cols[column].reshape(len(cols[column]), -1)[row, step])
                raise DataError(
                    f"{self.directory}/{split}.{column}.npy: row {row}: id {value} of {table} is "
                    f"outside its table ({size} rows)"
                )


class TaobaoBatchSource:
    """A `BatchSource` over one split; batch_size is the global batch (sharded by rank)."""

    num_dense = 1

    def __init__(
        self,
        data: str | Path | TaobaoDataset,
        split: str = "train",
        batch_size: int = 256,
        *,
        layout: str = "sequence",
        randomize: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.dataset = data if isinstance(data, TaobaoDataset) else TaobaoDataset(data)
        if layout not in LAYOUTS:
            raise DataError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
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
        self.split, self.batch_size, self.layout = split, batch_size, layout
        self.randomize, self.seed, self.drop_last = randomize, seed, drop_last
        self.rank, self.world_size = rank, world_size
        self.table_sizes = self.dataset.table_sizes
        self.feature_names = self.dataset.feature_names
        self.ts_length = self.dataset.ts_length
        self._cols = self.dataset.columns(split)
        self.num_samples = len(self._cols["labels"])
        steps = self.ts_length + 1
        self.positions = (np.arange(steps, dtype=np.float32) / steps).reshape(-1, 1)

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def rows(self, epoch: int, index: int) -> np.ndarray:
        """Row numbers of this rank's part of batch `index` (sorted: gathers stay sequential)."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        lo = index * self.batch_size
        size = min(self.batch_size, self.num_samples - lo)
        per, extra = divmod(size, self.world_size)
        start = lo + self.rank * per + min(self.rank, extra)
        positions = np.arange(start, start + per + (1 if self.rank < extra else 0), dtype=np.int64)
        if not self.randomize:
            return positions
        return np.sort(
            FeistelPermutation(self.num_samples, derive_key(self.seed, epoch))(positions)
        )

    def batch(self, epoch: int, index: int) -> Batch:
        rows = self.rows(epoch, index)
        c = self._cols
        items, cats = np.take(c["items"], rows, axis=0), np.take(c["categories"], rows, axis=0)
        users = np.take(c["users"], rows)
        labels = torch.from_numpy(np.take(c["labels"], rows).astype(np.float32))
        if self.layout == "candidate":
            items, cats, users = items[:, -1:], cats[:, -1:], users[:, None]
            dense = np.repeat(self.positions[-1:], len(rows), axis=0)
        else:
            users = np.repeat(users[:, None], self.ts_length + 1, axis=1)
            dense = np.tile(self.positions, (len(rows), 1))
        values = np.concatenate([users.reshape(-1), items.reshape(-1), cats.reshape(-1)]).astype(
            np.int64
        )
        kjt = KeyedJaggedTensor(
            keys=self.feature_names,
            values=torch.from_numpy(values),
            lengths=torch.from_numpy(np.ones(len(values), dtype=np.int32)),
        )
        return Batch(dense_features=torch.from_numpy(dense), sparse_features=kjt, labels=labels)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        if not 0 <= start <= len(self):
            raise IndexError(f"start batch {start} of {len(self)}")
        for i in range(start, len(self)):
            yield self.batch(epoch, i)
