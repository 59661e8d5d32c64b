"""Placement in the trainer: profile a sample of the training batches, plan, build the collection;
and the FAE schedule that regroups each epoch into hot and cold mini-batches.

`--placement`:
- `device`: every table on the training device (the fused collection, as before);
- `host`:   every table in host memory, pooled embeddings sent to the device (CPU-GPU hybrid);
- `fae`:    hot rows replicated on the device, hot mini-batches trained there (embeddings/hybrid.py);
- `auto`:   `device` when all tables (weights + optimizer state) fit `--hot-budget`, else `fae`.

The plan comes from `--placement-plan` when that file exists; otherwise from the access profile
(`--profile-file` when it exists, else a `--profile-sample-rate` share of the epoch-0 training
batches, evenly spread) and `--hot-budget`. Profile and plan are written to the run directory
(and to `--profile-file` / `--placement-plan` when those did not exist yet); a resumed run reuses
the run directory's plan, so it trains with exactly the placement of the interrupted one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import ConfigError, TrainConfig
from embeddings import FusedEmbeddingBagCollection, SparseOptimizer, TableSpec
from embeddings.fae_scheduler import window_bounds, window_layout
from embeddings.hybrid import HybridEmbeddingBagCollection
from embeddings.placement import (
    PlacementError,
    PlacementPlan,
    fits_on_device,
    parse_bytes,
    plan_placement,
    row_bytes,
)
from embeddings.profile import AccessProfile, AccessProfiler, ProfileError

log = logging.getLogger(__name__)

PLACEMENTS = ("device", "host", "fae", "auto")
PROFILE_NAME = "access_profile.npz"
PLAN_NAME = "placement_plan.npz"


def resolve_placement(cfg: TrainConfig, tables: list[TableSpec], opt: SparseOptimizer) -> str:
    if cfg.placement != "auto":
        return cfg.placement
    budget = parse_bytes(cfg.hot_budget)
    sizes, dims = [t.num_embeddings for t in tables], [t.embedding_dim for t in tables]
    return "device" if fits_on_device(sizes, dims, opt, budget) else "fae"


def build_embeddings(cfg: TrainConfig, tables: list[TableSpec], train_source, device: torch.device) -> nn.Module:
    """The embedding collection `--placement` asks for (profiling and planning when it is fae)."""
    opt = SparseOptimizer(cfg.optimizer, cfg.learning_rate)
    try:
        kind = resolve_placement(cfg, tables, opt)
        if kind == "device":
            return FusedEmbeddingBagCollection(tables, opt, device=device, backend=cfg.embedding_backend, seed=cfg.seed)
        if kind == "host":
            return HybridEmbeddingBagCollection(tables, opt, None, device, cfg.embedding_backend, cfg.seed)
        plan = obtain_plan(cfg, tables, opt, train_source)
        return HybridEmbeddingBagCollection(tables, opt, plan, device, cfg.embedding_backend, cfg.seed)
    except (PlacementError, ProfileError) as e:
        raise ConfigError(str(e)) from None


def obtain_plan(cfg: TrainConfig, tables: list[TableSpec], opt: SparseOptimizer, train_source) -> PlacementPlan:
    names = [t.feature_name for t in tables]
    sizes = [t.num_embeddings for t in tables]
    dims = [t.embedding_dim for t in tables]
    run_plan = cfg.run_dir / PLAN_NAME
    given = Path(cfg.placement_plan).with_suffix(".npz") if cfg.placement_plan else None
    if given is not None and given.is_file():
        plan, source = PlacementPlan.load(given), f"--placement-plan {given}"
    elif cfg.resume and run_plan.is_file():
        plan, source = PlacementPlan.load(run_plan), str(run_plan)
    else:
        profile = obtain_profile(cfg, names, sizes, train_source)
        plan = plan_placement(profile, dims, opt, parse_bytes(cfg.hot_budget))
        source = None
        if given is not None:
            plan.save(given)
    plan.check_fits(names, sizes, dims, opt.kind, source or "placement plan")
    plan.save(run_plan)
    r = plan.report
    log.info(
        "fae placement: %d hot rows (%.1f MB), in-sample hot lookups %.3f, hot inputs %.3f",
        plan.num_hot, plan.device_bytes() / 2**20, r.get("hot_lookup_share") or 0.0, r.get("hot_input_share") or 0.0,
    )  # fmt: skip
    return plan


def obtain_profile(cfg: TrainConfig, names: list[str], sizes: list[int], train_source) -> AccessProfile:
    given = Path(cfg.profile_file) if cfg.profile_file else None
    if given is not None and given.is_file():
        profile = AccessProfile.load(given)
        if profile.feature_names != names or profile.table_sizes != sizes:
            raise ProfileError(f"--profile-file {given}: made for other tables than this model's")
        return profile
    profile = profile_training_sample(train_source, names, sizes, cfg.profile_sample_rate)
    profile.save(given if given is not None else cfg.run_dir / PROFILE_NAME)
    return profile


def profile_training_sample(source, names: list[str], sizes: list[int], rate: float) -> AccessProfile:
    """Counts over `rate` of the epoch-0 training batches, evenly spread over the epoch."""
    n = len(source)
    k = min(n, max(1, math.ceil(rate * n)))
    profiler = AccessProfiler(sizes, names)
    for j in range(k):
        start = (j * n) // k
        batch = next(iter(source.batches(0, start=start)))
        profiler.add_kjt(batch.sparse_features)
    return profiler.finish(sample_rate=k / n)


# --- the FAE schedule ---------------------------------------------------------------------------


def concat_batches(parts: list[Batch]) -> Batch:
    """Batches joined along the batch dimension (features in the first one's key order)."""
    if len(parts) == 1:
        return parts[0]
    keys = parts[0].sparse_features.keys()
    T = len(keys)
    lengths, per_table = [], []
    for b in parts:
        kjt = b.sparse_features
        if kjt.keys() != keys:
            kjt = kjt.permute([kjt.keys().index(f) for f in keys])
        ln = kjt.lengths().view(T, kjt.stride())
        lengths.append(ln)
        per_table.append(torch.split(kjt.values(), ln.sum(1).tolist()))
    values = torch.cat([pt[t] for t in range(T) for pt in per_table])
    ln = torch.cat(lengths, dim=1)
    kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=ln.reshape(-1), stride=ln.shape[1])
    return Batch(
        dense_features=torch.cat([b.dense_features for b in parts]),
        sparse_features=kjt,
        labels=torch.cat([b.labels for b in parts]),
    )


class _Window:
    """A window's inputs with their per-(feature, input) lengths and starts computed once, so
    cutting many mini-batches out of it costs only their own lookups."""

    def __init__(self, batch: Batch) -> None:
        kjt = batch.sparse_features
        self.keys = kjt.keys()
        self.size, T = kjt.stride(), len(self.keys)
        self.lengths = kjt.lengths().view(T, self.size).long()
        self.starts = kjt.offsets()[:-1].view(T, self.size).long()
        self.lengths_dtype = kjt.lengths().dtype
        self.values, self.dense, self.labels = kjt.values(), batch.dense_features, batch.labels

    def select(self, idx: np.ndarray) -> Batch:
        sel = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
        new_len = self.lengths[:, sel].reshape(-1)
        new_start = self.starts[:, sel].reshape(-1)
        total = int(new_len.sum())
        first = torch.zeros(new_len.numel(), dtype=torch.int64)
        first[1:] = torch.cumsum(new_len, 0)[:-1]
        pos = new_start.repeat_interleave(new_len, output_size=total) + (
            torch.arange(total) - first.repeat_interleave(new_len, output_size=total)
        )
        kjt = KeyedJaggedTensor(
            keys=self.keys, values=self.values[pos], lengths=new_len.to(self.lengths_dtype), stride=sel.numel()
        )
        return Batch(dense_features=self.dense[sel], sparse_features=kjt, labels=self.labels[sel])


def select_batch(batch: Batch, idx: np.ndarray) -> Batch:
    """The inputs at positions `idx` of a batch (all features), vectorised."""
    return _Window(batch).select(idx)


class FAEBatchSource:
    """A training `BatchSource` regrouped by the FAE scheduler (embeddings/fae_scheduler.py).

    Batch k of an epoch depends only on the wrapped source's batches of k's window, so the
    regrouped epoch is a deterministic function of (seed, epoch) and resumable at any batch.
    """

    def __init__(
        self,
        source,
        classify: Callable[[KeyedJaggedTensor], torch.Tensor],
        switch_period: int,
        order: str = "interleave",
        num_batches: int = 0,
    ) -> None:
        self.source = source
        self.classify = classify
        self.switch_period = switch_period
        self.order = order
        self.batch_size = source.batch_size
        self.num_dense = source.num_dense
        self.table_sizes = source.table_sizes
        self.feature_names = source.feature_names
        self.num_batches = min(len(source), num_batches) if num_batches else len(source)
        window_bounds(self.num_batches, switch_period, order)  # validates

    def __len__(self) -> int:
        return self.num_batches

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Batch]:
        for ws, we in window_bounds(self.num_batches, self.switch_period, self.order):
            if we <= start:
                continue
            src = self.source.batches(epoch, start=ws)
            parts = [next(src) for _ in range(we - ws)]
            size = int(parts[0].labels.numel())  # the source's batch (this rank's shard)
            joined = concat_batches(parts)
            del parts
            hot = self.classify(joined.sparse_features).numpy()
            window = _Window(joined)
            for j, (_, idx) in enumerate(window_layout(hot, max(size, 1), self.order)):
                if ws + j >= start and ws + j < self.num_batches:
                    yield window.select(idx)


def schedule_training_data(cfg: TrainConfig, data, embeddings: nn.Module, per_epoch: int):
    """`data` with its training split regrouped into hot and cold mini-batches when FAE is on."""
    if not isinstance(embeddings, HybridEmbeddingBagCollection) or not embeddings.num_hot:
        return data
    train = FAEBatchSource(data.train, embeddings.hot_input_mask, cfg.fae_switch_period, cfg.fae_order, per_epoch)
    return dataclasses.replace(data, train=train)


def placement_summary(embeddings: nn.Module, device: torch.device) -> dict:
    """The summary's `placement` block: where rows live and the transfer counters."""
    placement = "device"
    if isinstance(embeddings, HybridEmbeddingBagCollection):
        placement = "fae" if embeddings.num_hot else "host"
    tables = embeddings.tables
    rows = sum(t.num_embeddings for t in tables)
    rb = row_bytes(tables[0].embedding_dim, embeddings.optimizer)
    out = {
        "kind": placement,
        "device": str(device),
        "backend": embeddings.backend,
        "tables": len(tables),
        "rows": rows,
        "embedding_bytes": sum(t.num_embeddings * t.embedding_dim * 4 for t in tables),
        "embedding_bytes_with_state": rows * rb,
    }
    if isinstance(embeddings, HybridEmbeddingBagCollection):
        out.update(embeddings.placement_info())
        out.update(embeddings.transfer_stats())
    else:
        out.update(
            emb_bytes_h2d=0, emb_bytes_d2h=0, emb_bytes_h2d_lookup=0, emb_bytes_d2h_lookup=0,
            emb_bytes_h2d_sync=0, emb_bytes_d2h_sync=0, syncs=0, emb_bytes_per_sample=0.0,
            hot_input_share=1.0 if placement == "device" else 0.0,
        )  # fmt: skip
    return out


def transfer_counters(embeddings: nn.Module, times: dict[str, float] | None = None) -> dict:
    """The counters (and time per phase, from the trainer's `times`) for a metrics.jsonl event;
    empty for placements without transfers."""
    if isinstance(embeddings, HybridEmbeddingBagCollection):
        s = embeddings.transfer_stats()
        keep = (
            "emb_bytes_h2d", "emb_bytes_d2h", "emb_bytes_h2d_lookup", "emb_bytes_d2h_lookup",
            "emb_bytes_h2d_sync", "emb_bytes_d2h_sync", "syncs", "hot_input_share", "sync_s",
        )  # fmt: skip
        out = {k: s[k] for k in keep}
        out.update({k: times[k] for k in ("hot_s", "cold_s") if times and k in times})
        return out
    return {}


def sync_tiers(embeddings: nn.Module) -> None:
    """Both tiers current (before evaluation and checkpoints); nothing to do for one-tier placements."""
    if isinstance(embeddings, HybridEmbeddingBagCollection):
        embeddings.sync()


def checkpoint_extra(embeddings: nn.Module) -> dict:
    """The transfer counters, so a resumed run's metrics continue where they were."""
    if isinstance(embeddings, HybridEmbeddingBagCollection):
        return {"placement_stats": embeddings.stats.state_tensor()}
    return {}


def load_checkpoint_extra(embeddings: nn.Module, data: dict) -> None:
    if isinstance(embeddings, HybridEmbeddingBagCollection) and "placement_stats" in data:
        embeddings.stats.load_state_tensor(data["placement_stats"])
