"""What a run needs per tier before any table is made: the dense part, its activations at the
batch size and the data loader (`dense_needs`), and a placement's rows on top (`with_placement`,
each kind's `memory_needs`, dlrm/placement/kinds.py). The pre-flight check
(dlrm/placement/memory_check.py) and the planner (dlrm/placement/enumerator.py) count the same.
"""

from __future__ import annotations

import torch
from torch import nn

from dlrm.build import build_model, table_sizes
from dlrm.config import TrainConfig
from dlrm.data import DataSplits
from dlrm.errors import ConfigError
from dlrm.placement.build_collection import placement_needs
from embeddings import TableSpec, tables_for_features
from embeddings.room import Needs

ACTIVATION_COPIES = 3
LOADER_BATCHES = 10  # the source builds up to 8 ahead (data_pipeline), the step and its pipeline
TIER_NAMES = {"device": "CUDA memory", "host": "host DRAM", "disk": "disk"}


def dense_needs(cfg: TrainConfig, data: DataSplits) -> Needs:
    """The dense part, its activations at the batch size and the data loader (module docstring)."""
    # the MLPs, no tables, on the meta device: counted without allocating (a DCN of rank 1e8
    # would otherwise take its terabytes before this check could refuse it)
    with torch.device("meta"):
        model = build_model(cfg, data, torch.device("meta"), nn.Module())
    params = sum(p.numel() for p in model.dense_parameters())
    widths = sum(m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    del model
    n = len(data.table_sizes)
    per_row = widths + n * cfg.arch.sparse_feature_size + (n + 1) ** 2
    opt = cfg.training.sparse_optimizer()
    needs = Needs()
    needs.add("device", "dense part", 4 * params * (2 + opt.dense_state_floats()))
    if len(data.train):
        batch = data.train.batch(0, 0)
        rows, size = batch.dense_features.shape[0], _batch_bytes(batch)
        test = cfg.eval_batch_size / cfg.training.mini_batch_size
        acts = 4 * per_row * rows * max(ACTIVATION_COPIES, test)
        needs.add("device", f"activations at batch {cfg.training.mini_batch_size}", int(acts))
        needs.add("host", "data loader", int(size * (LOADER_BATCHES + 2 * test)))
    return needs


def _batch_bytes(batch) -> int:
    kjt = batch.sparse_features
    tensors = (batch.dense_features, batch.labels, kjt.values(), kjt.lengths())
    return sum(t.numel() * t.element_size() for t in tensors)


def run_tables(cfg: TrainConfig, data: DataSplits) -> list[TableSpec]:
    sizes = table_sizes(cfg, data)
    return tables_for_features(sizes, cfg.arch.sparse_feature_size, data.feature_names)


def with_placement(base: Needs, cfg: TrainConfig, tables: list[TableSpec]) -> Needs:
    needs = Needs(list(base.items), base.disk_dir).extend(placement_needs(cfg, tables))
    if cfg.run.resume:
        needs.add("host", "checkpoint read (--resume)", needs.rows_in_memory())
    return needs


def changed(cfg: TrainConfig, over: dict) -> TrainConfig | None:
    """`cfg` with `over`, or None when the combination is refused by the settings' rules."""
    try:
        return cfg.replace(**over)
    except ConfigError:
        return None
