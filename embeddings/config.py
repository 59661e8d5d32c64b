"""Configuration shared by every embedding collection: tables and the fused sparse optimizer."""

from __future__ import annotations

from dataclasses import dataclass

SPARSE_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")


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


@dataclass(frozen=True)
class SparseOptimizer:
    """The optimizer fused into the embedding backward (as fbgemm's table-batched embeddings do).

    `sgd`:              w -= lr * g
    `adagrad`:          s += g*g (per element);        w -= lr * g / (sqrt(s) + eps)
    `rowwise_adagrad`:  s += mean(g*g) (one per row);  w -= lr * g / (sqrt(s) + eps)
    where g is the gradient of a row summed over every lookup of that row in the batch.
    """

    kind: str = "sgd"
    learning_rate: float = 0.01
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in SPARSE_OPTIMIZERS:
            raise ValueError(
                f"unknown sparse optimizer {self.kind!r}: expected one of {', '.join(SPARSE_OPTIMIZERS)}"
            )

    def state_floats(self, dim: int) -> int:
        """Optimizer-state floats stored per row of width `dim` (what placement budgets count)."""
        return {"sgd": 0, "adagrad": dim, "rowwise_adagrad": 1}[self.kind]


def tables_for_features(
    table_sizes: list[int], dim: int, feature_names: list[str] | None = None
) -> list[TableSpec]:
    names = feature_names or [f"cat_{i}" for i in range(len(table_sizes))]
    if len(names) != len(table_sizes):
        raise ValueError(f"{len(table_sizes)} table sizes for {len(names)} features")
    return [TableSpec(f"t_{f}", int(n), dim, f) for f, n in zip(names, table_sizes)]
