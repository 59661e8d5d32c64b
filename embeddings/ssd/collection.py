"""`--placement tiered`: hot rows in the device tier, every other row's home an SSD file behind a
DRAM row cache (embeddings/ssd/tier.py), behind the embedding-collection contract.

It is the staged collection (embeddings/staged/collection.py) with the SSD tier (embeddings/ssd/store.py) as
the cold rows' store: a mini-batch's cold rows are staged by the staging train pipeline on its
worker, mini-batches ahead (the prefetch: cache misses are read from the file while the current
step computes), loaded into the device tier's staging slots, trained there in one fused step, and
written back to the tier (into the row cache, dirty) when the next step loads. Every row has one
home; the cache holds copies that are written back on eviction and before checkpoints.

Initial values are `row_init.hashed_rows` for every row, hot or cold; `--placement device
--embedding-init hashed` starts from the same values. Checkpoints hold the hot rows and a
consistent point of the tier's files, not the tier's rows (embeddings/ssd/store.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError
from embeddings.plan import PlacementPlan
from embeddings.ssd.layout import RowLayout
from embeddings.ssd.store import ScmStore
from embeddings.ssd.tier import ScmTier
from embeddings.staged.collection import StagedEmbeddingBagCollection, one_home


@dataclass
class ScmSettings:
    """Where and how the SSD tier keeps its rows (`--scm-dir`, `--scm-cache`, `--scm-io`)."""

    directory: str
    cache_bytes: int
    io: str = "direct"
    io_threads: int = 16
    io_engine: str = "auto"  # aio | threads | auto (embeddings/ssd/file.py)
    io_depth: int = 64
    resume: bool = False  # keep the files for a checkpoint's restore
    owner: str = ""  # the run directory (a tier directory serves one run)
    layout: RowLayout | None = None  # where a new tier puts each row (None: row-id order)
    log_rows: int = 0  # the write-back log's rows, its map in cache_bytes (embeddings/ssd/log.py)


def profile_priority(counts: list[np.ndarray], sizes: list[int]):
    """`priority(gids)` for the row cache: each row's count in the access profile (0 when
    unseen), kept as the seen rows only (sorted global ids and their counts)."""
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    small = int(sum(sizes)) < 2**31  # global ids as int32 (Terabyte's 260M rows: half the bytes)
    ids = [
        (np.flatnonzero(c) + b).astype(np.int32 if small else np.int64)
        for c, b in zip(counts, base)
    ]
    gids = torch.from_numpy(np.concatenate(ids))
    vals = torch.from_numpy(np.concatenate([c[c > 0] for c in counts]).astype(np.int32))
    if not gids.numel():
        return None

    def priority(g: torch.Tensor) -> torch.Tensor:
        key = g.to(gids.dtype)
        at = torch.searchsorted(gids, key).clamp(max=gids.numel() - 1)
        return torch.where(gids[at] == key, vals[at].long(), torch.zeros_like(g))

    return priority


def tiered_collection(
    tables: list[TableSpec],
    optimizer: SparseOptimizer,
    plan: PlacementPlan,
    scm: ScmSettings,
    device: torch.device | str | None = None,
    backend: str = "auto",
    seed: int = 0,
    priority=None,
    staging_rows: int = 0,
) -> StagedEmbeddingBagCollection:
    """`plan`'s hot rows on `device`, every other row in the SSD tier `scm` describes (the row
    cache ranked by `priority`, profile counts)."""
    if plan is None:
        raise PlacementError("tiered placement: needs a plan (popularity is not learned online)")
    dims = [t.embedding_dim for t in tables]
    if len(set(dims)) != 1:  # checked before the tier's files are made, as the plan is
        raise ValueError("tiered placement: every embedding table must have the same width")
    plan.check_fits(
        [t.feature_name for t in tables], [t.num_embeddings for t in tables], dims,
        optimizer.kind, "placement plan",
    )  # fmt: skip
    plan = one_home(plan, ScmStore.name)
    tier = ScmTier(
        scm.directory, tables, optimizer, seed, scm.cache_bytes, held=None, io=scm.io,
        io_threads=scm.io_threads, priority=priority, resume=scm.resume, owner=scm.owner,
        io_engine=scm.io_engine, io_depth=scm.io_depth, layout=scm.layout,
        log_rows=scm.log_rows,
    )  # fmt: skip
    coll = StagedEmbeddingBagCollection(
        tables, optimizer, plan, ScmStore(tier), device, backend, seed, staging_rows, kind="tiered"
    )
    tier.held = lambda ids: coll.hot_map.slots(ids) < 0  # the hot rows' home: the device tier
    return coll
