"""Where embedding rows live and how they are looked up and updated.

The names below are imported on first use (PEP 562), so `import embeddings.config` or
`embeddings.hot_rows` (what a CLI needs to parse its flags) does not pay for torchrec and fbgemm.
"""

from hybrid_dlrm.common.lazy import lazy_exports
from hybrid_dlrm.common.stack import require

require("embeddings")  # before anything imports torch: one line, not a traceback

_HOME = {
    "EmbeddingCollection": "embeddings.collection",
    "EmbeddingLookup": "embeddings.collection",
    "FAEEmbeddingBagCollection": "embeddings.fae",
    "FusedEmbeddingBagCollection": "embeddings.fused",
    "SparseOptimizer": "embeddings.config",
    "TableSpec": "embeddings.config",
    "tables_for_features": "embeddings.config",
}

__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_exports(__name__, _HOME)
