"""Staged collections: hot rows in a device tier with staging slots, every other row's home an
injected row store, the cold rows a mini-batch touches staged before its step (Hotline, ISCA 2024).

- `contract`: what a train pipeline asks of a collection that stages (`stages`);
- `collection`: `StagedEmbeddingBagCollection`, behind the embedding-collection contract;
- `slot_tier`, `lookup_map`, `rows`: the device tier, a batch's lookups mapped onto it, and
  what staging one batch makes;
- `tables`, `checkpoint`: full tables from both tiers, and a store with files of its own;
- `hotline`: the host tier as the store (`--placement hotline`).
The SSD tier as the store is `embeddings.ssd`.
"""

from hybrid_dlrm.common.lazy import lazy_exports

_HOME = {
    "StagingCollection": "embeddings.staged.contract",
    "stages": "embeddings.staged.contract",
    "StagedEmbeddingBagCollection": "embeddings.staged.collection",
    "one_home": "embeddings.staged.collection",
    "SlotTier": "embeddings.staged.slot_tier",
    "map_lookups": "embeddings.staged.lookup_map",
    "hotline_collection": "embeddings.staged.hotline",
}

__all__ = sorted(_HOME)
__getattr__, __dir__ = lazy_exports(__name__, _HOME)
