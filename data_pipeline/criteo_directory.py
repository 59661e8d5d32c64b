"""An opened preprocessed Criteo directory: meta.json plus its columns, memory-mapped on first
use and verified against what preprocessing recorded.

Below both of its readers: the batch source (criteo_dataset.py) and the multi-hot bags
materialised from the one-hot ids (multi_hot.py), which the batch source takes in their place.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .dataset_meta import column_path, load_meta, marker_path, read_json
from .errors import DataError, numpy_failure
from .npy_stream import check_file, first_id_outside


class CriteoDataset:
    """An opened preprocessed directory: meta.json plus lazily memory-mapped columns."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.meta = load_meta(self.directory)
        self.table_sizes: list[int] = list(self.meta["table_sizes"])
        self.feature_names: list[str] = list(self.meta["feature_names"])
        self.num_dense: int = int(self.meta["num_dense"])
        self._parts = {p["name"]: p for p in self.meta["parts"]}
        self._columns: dict[str, tuple[np.ndarray | None, np.ndarray, np.ndarray]] = {}

    @property
    def splits(self) -> list[str]:
        return list(self.meta["splits"])

    def segments(self, split: str) -> list[tuple[str, int, int]]:
        if split not in self.meta["splits"]:
            raise DataError(
                f"{self.directory}: no split {split!r} (it has {', '.join(self.splits)})"
            )
        return [(s["part"], s["start"], s["stop"]) for s in self.meta["splits"][split]]

    def columns(self, part: str) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """(labels int8 or None, dense float32 [n, 13], sparse ids [n, 26]) of a part, mmapped."""
        if part not in self._columns:
            info = self._parts[part]
            arrays = []
            for column in ("labels", "dense", "sparse"):
                if column == "labels" and not info["has_labels"]:
                    arrays.append(None)
                    continue
                path = column_path(self.directory, part, column)
                try:
                    arr = np.load(path, mmap_mode="r", allow_pickle=False)
                except (OSError, ValueError) as e:
                    raise DataError(f"{path}: cannot be read ({numpy_failure(e)})") from None
                if arr.shape[0] != info["rows"]:
                    raise DataError(f"{path}: {arr.shape[0]} rows, meta.json says {info['rows']}")
                arrays.append(arr)
            self._verify(part, arrays[2])
            self._columns[part] = (arrays[0], arrays[1], arrays[2])
        return self._columns[part]

    def _verify(self, part: str, sparse: np.ndarray) -> None:
        """Before a part's first use in a process: every column file's CRC-32 against the one its
        preprocessing recorded, and every id below its table's size. Bytes changed on disk must
        never become numbers, and fbgemm's own bounds check would silently train an
        out-of-range id as row 0. One sequential read of the part (CRITEO.md: the cost)."""
        record = read_json(marker_path(self.directory, part))
        for column, file_record in record.get("files", {}).items():
            problem = check_file(column_path(self.directory, part, column), file_record, full=True)
            if problem:
                raise DataError(
                    f"{self.directory}: {problem}: it changed after preprocessing; "
                    "delete the directory and preprocess again"
                )
        bad = first_id_outside(sparse, self.table_sizes)
        if bad is not None:
            row, col = bad
            raise DataError(
                f"{column_path(self.directory, part, 'sparse')}: row {row}: id "
                f"{int(sparse[row, col])} of {self.feature_names[col]} is outside its table "
                f"({self.table_sizes[col]} rows)"
            )
