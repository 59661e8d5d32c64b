"""Where embedding rows live and how they are looked up and updated.

The names below are imported on first use (PEP 562), so `import embeddings.config` or
`embeddings.placement` (what a CLI needs to parse its flags) does not pay for torchrec and fbgemm.
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'embeddings' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
