"""Where embedding rows live and how they are looked up and updated."""

from embeddings.config import SparseOptimizer, TableSpec, tables_for_features
from embeddings.fused import FusedEmbeddingBagCollection

__all__ = ["FusedEmbeddingBagCollection", "SparseOptimizer", "TableSpec", "tables_for_features"]
