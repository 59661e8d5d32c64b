"""Configuration shared by every embedding collection: the tables (and the sparse optimizer,
re-exported from embeddings/optimizer.py)."""

from __future__ import annotations

from dataclasses import dataclass

# the optimizer lives in embeddings/optimizer.py; re-exported here for the many importers
from embeddings.optimizer import SPARSE_OPTIMIZERS, SparseOptimizer  # noqa: F401


@dataclass(frozen=True)
class TableSpec:
    """One embedding table, looked up by exactly one sparse feature."""

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_name: str

    def __post_init__(self) -> None:
        if self.num_embeddings < 1:
            raise ValueError(
                f"table {self.name}: num_embeddings must be >= 1, got {self.num_embeddings}"
            )
        if self.embedding_dim < 1:
            raise ValueError(
                f"table {self.name}: embedding_dim must be >= 1, got {self.embedding_dim}"
            )


def tables_for_features(
    table_sizes: list[int], dim: int, feature_names: list[str] | None = None
) -> list[TableSpec]:
    names = feature_names or [f"cat_{i}" for i in range(len(table_sizes))]
    if len(names) != len(table_sizes):
        raise ValueError(f"{len(table_sizes)} table sizes for {len(names)} features")
    return [TableSpec(f"t_{f}", int(n), dim, f) for f, n in zip(names, table_sizes)]
