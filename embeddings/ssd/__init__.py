"""The SSD tier (Software Defined Memory, Ardestani et al. 2021): embedding rows in files behind a
DRAM row cache, trained exactly and crash-safely.

- `collection`: `--placement tiered`, a staged collection whose row store is the tier;
- `store`: the tier as a staged collection's `RowStore`;
- `tier`: rows by global id through the row cache, the files under `--scm-dir`;
- `layout`: the file's row -> slot permutation, from the access profile;
- `cache`, `writes`, `journal`: the row cache, unstored writes, the undo journal;
- `file`, `aio`: checksummed 4 KiB blocks, O_DIRECT reads through Linux AIO;
- `serving`: an inference artifact's quantized tables served from the tier.
"""

from hybrid_dlrm.common.lazy import lazy_exports

_HOME = {
    "tiered_collection": "embeddings.ssd.collection",
    "ScmSettings": "embeddings.ssd.collection",
    "ScmStore": "embeddings.ssd.store",
    "ScmTier": "embeddings.ssd.tier",
    "RowLayout": "embeddings.ssd.layout",
    "RowCache": "embeddings.ssd.cache",
    "UndoJournal": "embeddings.ssd.journal",
    "ServingTier": "embeddings.ssd.serving",
}

__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_exports(__name__, _HOME)
