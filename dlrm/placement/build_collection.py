"""From `--placement` to an embedding collection: profile a sample of the training batches, plan,
build the collection; and the FAE schedule of the training split when the placement asks for it.

`--placement` names a registered placement kind (dlrm/placement/kinds.py; the built-in ones in
dlrm/placement/builtin_kinds.py), which builds its collection and counts its bytes; or `auto`,
the planner's choice (dlrm/placement/auto.py), applied to the configuration by the composition
root before this module sees it; `resolve_placement` keeps the rule of before (`device` when all
tables fit `--hot-budget`, else `fae`) for callers outside a run (a configuration rebuilt by a
tool, a resumed run from before the planner).

The plan comes from `--placement-plan` when that file exists; otherwise from the access profile
(`--profile-file` when it exists, else a `--profile-sample-rate` share of the epoch-0 training
batches, evenly spread) and `--hot-budget`. Profile and plan are written to the run directory
(and to `--profile-file` / `--placement-plan` when those did not exist yet); a resumed run reuses
the run directory's plan, so it trains with exactly the placement of the interrupted one.
"""

from __future__ import annotations

import logging

import torch

from dlrm.config import TrainConfig
from dlrm.errors import ConfigError
from dlrm.placement.kinds import AUTO, UnknownPlacement, placement_kind
from dlrm.placement.run_plan import PlacedEmbeddings
from dlrm.settings.placement import PlacementConfig
from embeddings import SparseOptimizer, TableSpec
from embeddings.collection import EmbeddingCollection
from embeddings.errors import PlacementError, ProfileError
from embeddings.hot_rows import fits_on_device, row_bytes
from embeddings.room import Needs

log = logging.getLogger(__name__)


def resolve_placement(
    placing: PlacementConfig, tables: list[TableSpec], opt: SparseOptimizer
) -> str:
    """The placement `placing` names; `auto` outside a run (see the module docstring): device
    when every table fits `--hot-budget`, else fae. A run replaces auto by the planner's choice
    first (dlrm/compose.py, dlrm/placement/auto.py's `resolve_auto`)."""
    if placing.placement != AUTO:
        return placing.placement
    budget = placing.hot_budget.bytes
    sizes, dims = [t.num_embeddings for t in tables], [t.embedding_dim for t in tables]
    return "device" if fits_on_device(sizes, dims, opt, budget) else "fae"


def build_embeddings(
    cfg: TrainConfig, tables: list[TableSpec], train_source, device: torch.device
) -> PlacedEmbeddings:
    """The embedding collection `--placement` asks for (profiling and planning when it is fae)."""
    opt = cfg.training.sparse_optimizer()
    try:
        kind = placement_kind(resolve_placement(cfg.placing, tables, opt))
        return kind.build(cfg, tables, train_source, device)
    except (PlacementError, ProfileError) as e:
        raise ConfigError(str(e)) from None


def placement_needs(cfg: TrainConfig, tables: list[TableSpec], kind: str | None = None) -> Needs:
    """What placement `kind` (default: what `--placement` resolves to) allocates per tier before
    training, counted as its plan's byte budgets count them (weights + optimizer state per row,
    `row_bytes`): at most `--hot-budget` of hot rows on the device, the tables (every row, or the
    cold ones where a row has one home) in their tier, the access profile's counts while
    planning; the SSD tier's part is dlrm/placement/tiered_setup.py's. Bounds from the budgets: the plan
    itself needs the profile, which comes later."""
    opt = cfg.training.sparse_optimizer()
    kind = kind or resolve_placement(cfg.placing, tables, opt)
    needs = placement_kind(kind).memory_needs(cfg, tables)
    rows = sum(t.num_embeddings for t in tables)
    if cfg.slipstreaming.enabled and not any(i.what == "access profile" for i in needs.items):
        needs.add("host", "access profile", 4 * rows)
    return needs


def schedule_training_data(cfg: TrainConfig, data, placed: PlacedEmbeddings, per_epoch: int):
    """`data` as the placement trains on it (FAE regroups the training split into hot and cold
    mini-batches); as it is for a placement no kind names (several processes' `auto`)."""
    try:
        kind = placement_kind(placed.kind)
    except UnknownPlacement:
        return data
    return kind.training_data(cfg, data, placed, per_epoch)


# --- what the run directory reports ---------------------------------------------------------------


def placement_summary(
    embeddings: EmbeddingCollection, device: torch.device, requested: str | None = None
) -> dict:
    """The summary's `placement` block: where rows live and the collection's counters;
    `requested`: the `--placement` asked for (`auto`: `kind` says what it picked)."""
    tables = embeddings.tables
    rows = sum(t.num_embeddings for t in tables)
    out = {
        "requested": requested,
        "device": str(device),
        "tables": len(tables),
        "rows": rows,
        "embedding_bytes": sum(t.num_embeddings * t.embedding_dim * 4 for t in tables),
        "embedding_bytes_with_state": rows
        * row_bytes(tables[0].embedding_dim, embeddings.optimizer),
    }
    out.update(embeddings.placement_info())
    out.update(embeddings.counters())
    return out


def logged_counters(embeddings: EmbeddingCollection, times: dict[str, float]) -> dict:
    """The counters (and time per step kind, from the trainer's timer) for a metrics.jsonl event;
    empty for placements that move nothing."""
    logged = embeddings.logged_counters()
    if not logged:
        return {}
    counters = embeddings.counters()
    out = {k: counters[k] for k in logged if k in counters}
    out.update({k: times[k] for k in ("hot_s", "cold_s") if k in times})
    return out
