"""Hotline's embeddings (Adnan et al., ISCA 2024): hot rows on the device, every other row only in
host memory (`HostTier`), cold rows staged per mini-batch (embeddings/staged/collection.py).

With `plan=None` every row starts on the host and the popular rows are learned online (`observe`,
then `adopt(plan)`): the host tier then keeps only the rest.
"""

from __future__ import annotations

import torch

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.memory_tiers import HostTier
from embeddings.plan import PlacementPlan
from embeddings.staged.collection import StagedEmbeddingBagCollection, one_home


def hotline_collection(
    tables: list[TableSpec],
    optimizer: SparseOptimizer = SparseOptimizer(),
    plan: PlacementPlan | None = None,
    device: torch.device | str | None = None,
    backend: str = "auto",
    seed: int = 0,
    staging_rows: int = 0,
) -> StagedEmbeddingBagCollection:
    """`plan`'s hot rows on `device`, the others in a `HostTier` (every row while `plan` is None),
    initialised as the fused collection of the same `seed` initialises them."""
    remaps = None
    if plan is not None:
        plan.check_fits(
            [t.feature_name for t in tables], [t.num_embeddings for t in tables],
            [t.embedding_dim for t in tables], optimizer.kind, "placement plan",
        )  # fmt: skip
        plan = one_home(plan, HostTier.name)
        remaps = plan.tier_remaps(HostTier.name)
    store = HostTier(tables, optimizer, remaps, backend, seed)
    return StagedEmbeddingBagCollection(
        tables, optimizer, plan, store, device, backend, seed, staging_rows, kind="hotline"
    )
