"""From `--placement` to an embedding collection: profile a sample of the training batches, plan,
build the collection; and the FAE schedule of the training split when the placement asks for it.

`--placement`:
- `device`: every table on the training device (the fused collection);
- `host`:   every table in host memory, pooled embeddings sent to the device (CPU-GPU hybrid);
- `fae`:    hot rows replicated on the device, hot mini-batches trained there (embeddings/fae.py);
- `hotline`: hot rows only on the device, the rest only on the host, every mini-batch split into
  popular and non-popular inputs (embeddings/staged/hotline.py, dlrm/pipelines/staging.py); with
  `--hotline-learn-batches N` the plan is learned over the first N mini-batches instead;
- `tiered`: hot rows on the device, every other row in an SSD file behind a DRAM row cache
  (dlrm/placement/tiered_setup.py, embeddings/ssd/collection.py);
- `auto`:   the planner's choice (dlrm/placement/auto.py), applied to the configuration by the
  composition root before this module sees it; `resolve_placement` keeps the rule of before
  (`device` when all tables fit `--hot-budget`, else `fae`) for callers outside a run (a
  configuration rebuilt by a tool, a resumed run from before the planner).

The plan comes from `--placement-plan` when that file exists; otherwise from the access profile
(`--profile-file` when it exists, else a `--profile-sample-rate` share of the epoch-0 training
batches, evenly spread) and `--hot-budget`. Profile and plan are written to the run directory
(and to `--profile-file` / `--placement-plan` when those did not exist yet); a resumed run reuses
the run directory's plan, so it trains with exactly the placement of the interrupted one.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from dlrm.config import TrainConfig
from dlrm.errors import ConfigError
from dlrm.pipelines.fae_batches import FAEBatchSource
from dlrm.placement.run_plan import PlacedEmbeddings, PlanFiles, hotline_plan, obtain_plan
from dlrm.placement.tiered_setup import build_tiered, tiered_needs
from dlrm.settings.placement import FaeConfig, PlacementConfig
from embeddings import FusedEmbeddingBagCollection, SparseOptimizer, TableSpec
from embeddings.collection import EmbeddingCollection
from embeddings.errors import PlacementError, ProfileError
from embeddings.fae import FAEEmbeddingBagCollection
from embeddings.hot_inputs import AllHotClassifier
from embeddings.hot_rows import fits_on_device, row_bytes
from embeddings.room import Needs
from embeddings.row_init import hashed_init_
from embeddings.staged.hotline import hotline_collection

log = logging.getLogger(__name__)

PLACEMENTS = ("device", "host", "fae", "hotline", "tiered", "auto")


def resolve_placement(
    placing: PlacementConfig, tables: list[TableSpec], opt: SparseOptimizer
) -> str:
    """The placement `placing` names; `auto` outside a run (see the module docstring): device
    when every table fits `--hot-budget`, else fae. A run replaces auto by the planner's choice
    first (dlrm/compose.py, dlrm/placement/auto.py's `resolve_auto`)."""
    if placing.placement != "auto":
        return placing.placement
    budget = placing.hot_budget.bytes
    sizes, dims = [t.num_embeddings for t in tables], [t.embedding_dim for t in tables]
    return "device" if fits_on_device(sizes, dims, opt, budget) else "fae"


def build_embeddings(
    cfg: TrainConfig, tables: list[TableSpec], train_source, device: torch.device
) -> PlacedEmbeddings:
    """The embedding collection `--placement` asks for (profiling and planning when it is fae)."""
    opt = cfg.training.sparse_optimizer()
    backend, seed = cfg.arch.embedding_backend, cfg.training.seed
    try:
        kind = resolve_placement(cfg.placing, tables, opt)
        if kind == "device":
            coll = FusedEmbeddingBagCollection(
                tables, opt, device=device, backend=backend, seed=seed
            )
            if cfg.placing.embedding_init == "hashed":  # the tiered placement's initial values
                hashed_init_(coll.table_weights(), seed)
                coll.after_tables_written()
            return PlacedEmbeddings(coll, kind)
        if kind == "tiered":
            return build_tiered(cfg, tables, opt, train_source, device)
        if kind == "host":
            return PlacedEmbeddings(
                FAEEmbeddingBagCollection(tables, opt, None, device, backend, seed), kind
            )
        if kind == "hotline":
            plan = hotline_plan(cfg, tables, opt, train_source)
            coll = hotline_collection(tables, opt, plan, device, backend, seed)
            return PlacedEmbeddings(coll, kind, plan)
        plan = obtain_plan(cfg.placing, PlanFiles.of(cfg), tables, opt, train_source)
        return PlacedEmbeddings(
            FAEEmbeddingBagCollection(tables, opt, plan, device, backend, seed), kind, plan
        )
    except (PlacementError, ProfileError) as e:
        raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class _Layout:
    """Where a placement keeps rows, for its byte needs."""

    tables: str  # the tier holding the tables: every row, or every cold row with `one_home`
    hot_on_device: bool = False  # hot rows (at most --hot-budget of them) on the device too
    one_home: bool = False  # hot rows leave the tables' tier; cold rows staged into slots
    remaps: bool = False  # the plan's device remaps materialised (4 bytes a row: FAE)


_LAYOUTS = {
    "device": _Layout("device"),
    "host": _Layout("host"),
    "fae": _Layout("host", hot_on_device=True, remaps=True),
    "hotline": _Layout("host", hot_on_device=True, one_home=True),
}


def placement_needs(cfg: TrainConfig, tables: list[TableSpec], kind: str | None = None) -> Needs:
    """What placement `kind` (default: what `--placement` resolves to) allocates per tier before
    training, counted as its plan's byte budgets count them (weights + optimizer state per row,
    `row_bytes`): at most `--hot-budget` of hot rows on the device, the tables (every row, or the
    cold ones where a row has one home) in their tier, the access profile's counts while
    planning; the SSD tier's part is dlrm/placement/tiered_setup.py's. Bounds from the budgets: the plan
    itself needs the profile, which comes later."""
    opt = cfg.training.sparse_optimizer()
    kind = kind or resolve_placement(cfg.placing, tables, opt)
    total = sum(t.num_embeddings * row_bytes(t.embedding_dim, opt) for t in tables)
    rows = sum(t.num_embeddings for t in tables)
    hot = min(cfg.placing.hot_budget.bytes, total)
    if kind == "tiered":
        needs = tiered_needs(cfg, tables, opt, hot)
    else:
        at, needs = _LAYOUTS[kind], Needs()
        if at.hot_on_device:
            needs.add("device", "hot rows + optimizer state", hot, rows=True)
            if at.one_home:
                staging = max(cfg.training.mini_batch_size, cfg.training.test_mini_batch_size)
                needs.add("device", "staging slots", staging * total // max(1, rows) * len(tables))
            needs.add("host", "access profile", 4 * rows)
        needs.add(
            at.tables, "tables + optimizer state", total - (hot if at.one_home else 0), rows=True
        )
        if at.remaps:
            needs.add("host", "placement plan remaps", 4 * rows)
    if cfg.slipstreaming.enabled and not any(i.what == "access profile" for i in needs.items):
        needs.add("host", "access profile", 4 * rows)
    return needs


def schedule_training_data(fae: FaeConfig, data, placed: PlacedEmbeddings, per_epoch: int):
    """`data` with its training split regrouped into hot and cold mini-batches when FAE is on."""
    if placed.kind != "fae" or placed.plan is None or not placed.plan.num_hot:
        return data
    classify = AllHotClassifier(placed.plan)
    train = FAEBatchSource(data.train, classify, fae.switch_period, fae.order, per_epoch)
    return dataclasses.replace(data, train=train)


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
