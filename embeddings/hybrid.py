"""Hot/cold hybrid embeddings (FAE, Adnan et al., VLDB 2022), with the fused collection's contract.

Two tiers:
- the host tier holds every row of every table (weights + optimizer state) in host memory, as a
  `FusedEmbeddingBagCollection` on the CPU (fbgemm's CPU kernels where available);
- the device tier holds the plan's hot rows, all tables in one concatenated [hot rows, dim]
  table (and its optimizer state) on the training device, looked up with PyTorch's own ops
  (the CUDA fbgemm wheel is not assumed).

A mini-batch is *hot* when every one of its lookups is a hot row: it runs entirely on the device
tier (no embedding bytes cross PCIe). Any other mini-batch is *cold*: it is pooled on the host
tier, and the pooled embeddings go to the device and their gradients come back. Each tier is
authoritative for the rows it last updated; before a tier is read it receives, in one vectorised
copy, the hot rows the other tier changed since the last sync (weights AND optimizer state).
`sync()` brings both up to date; it runs before evaluation and checkpoints, and `state_dict`,
`table_weights`, `optimizer_states` and `sparse_state_dict` call it, so exports are the full,
current tables whatever the placement.

With `plan=None` it is the host-only placement: every lookup on the host tier, pooled
embeddings transferred (the CPU-GPU hybrid baseline of the FAE paper).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.fused import FusedEmbeddingBagCollection
from embeddings.placement import PlacementPlan, row_bytes
from embeddings.torch_tbe import FusedLookup, apply_sparse_update
from embeddings.transfer_stats import TransferStats

log = logging.getLogger(__name__)


class _ToDevice(torch.autograd.Function):
    """Pooled embeddings host -> device; gradients device -> host. Counts both (training only)."""

    @staticmethod
    def forward(ctx, pooled, device, stats: TransferStats):  # type: ignore[override]
        ctx.stats = stats
        stats.emb_bytes_h2d_lookup += pooled.numel() * pooled.element_size()
        out = pooled.to(device, non_blocking=True)
        return pooled.view_as(pooled) if out is pooled else out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.stats.emb_bytes_d2h_lookup += grad.numel() * grad.element_size()
        return grad.to("cpu"), None, None


class _HotTable:
    """The device tier as the fused lookup sees it (`weight`, `update`); an update also marks
    its rows as newer than the host's copy."""

    def __init__(self, coll: HybridEmbeddingBagCollection) -> None:
        self.coll = coll

    @property
    def weight(self) -> torch.Tensor:
        return self.coll.hot_weight

    def update(self, rows: torch.Tensor, grad: torch.Tensor) -> None:
        c = self.coll
        apply_sparse_update(c.hot_weight, c.hot_state, rows, grad, c.optimizer, c.lr)
        c._device_dirty.index_fill_(0, rows, True)
        c._device_ahead = True


def _flat_rows(views: list[torch.Tensor]) -> torch.Tensor | None:
    """One [sum rows, ...] view over per-table views laid back to back in one buffer, else None."""
    first = views[0]
    trail = tuple(first.shape[1:])
    row_elems = int(np.prod(trail)) if trail else 1
    expect = first.data_ptr()
    for v in views:
        if tuple(v.shape[1:]) != trail or not v.is_contiguous() or v.data_ptr() != expect:
            return None
        expect += v.shape[0] * row_elems * v.element_size()
    total = sum(v.shape[0] for v in views)
    return first.as_strided((total, *trail), first.stride(), first.storage_offset())


class HybridEmbeddingBagCollection(nn.Module):
    """FAE hot/cold embeddings (or host-only with `plan=None`); same face as the fused collection."""

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer = SparseOptimizer(),
        plan: PlacementPlan | None = None,
        device: torch.device | str | None = None,
        host_backend: str = "auto",
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.tables = list(tables)
        self.feature_names = [t.feature_name for t in tables]
        self.dims = [t.embedding_dim for t in tables]
        self.optimizer = optimizer
        self.lr = optimizer.learning_rate
        self.device = torch.device(device or "cpu")
        self.plan = plan
        self.stats = TransferStats()
        self.last_phase: str | None = None  # "hot" or "cold": the last training mini-batch's kind
        host = FusedEmbeddingBagCollection(
            tables, optimizer, device="cpu", backend=host_backend, seed=seed
        )
        object.__setattr__(self, "host", host)  # not a submodule: exports go through our state dict
        self.backend = f"hybrid(host={host.backend}, device=torch)"
        sizes = [t.num_embeddings for t in tables]
        self._row_base = torch.zeros(len(tables), dtype=torch.int64)
        self._row_base[1:] = torch.cumsum(torch.tensor(sizes[:-1], dtype=torch.int64), 0)
        self.num_hot = 0
        if plan is not None:
            plan.check_fits(self.feature_names, sizes, self.dims, optimizer.kind, "placement plan")
            self.num_hot = plan.num_hot
        if self.num_hot and len(set(self.dims)) != 1:
            raise ValueError(
                "hybrid placement: the hot table needs every embedding table to have the same width"
            )
        self._row_bytes = row_bytes(self.dims[0], optimizer)
        self._w_flat = _flat_rows(host.table_weights())
        states = host.optimizer_states()
        self._s_flat = None if states[0] is None else _flat_rows(states)
        self._setup_device_tier()

    # --- the device tier ----------------------------------------------------------------------

    def _setup_device_tier(self) -> None:
        dev, H = self.device, self.num_hot
        dim = self.dims[0]
        self._device_ahead = False  # device has hot rows newer than the host's copy
        self._host_ahead = False  # host has hot rows newer than the device's copy
        if not H:
            self.hot_weight = self.hot_state = None
            return
        remap, _ = self.plan.concatenated_remap()
        self._remap = {torch.device("cpu"): torch.from_numpy(remap)}
        if dev.type != "cpu":
            self._remap[dev] = self._remap[torch.device("cpu")].to(dev)
        hot_t, hot_r = self.plan.hot_ids()
        self._hot_gid = torch.from_numpy(
            hot_r + self._row_base.numpy()[hot_t]
        )  # host flat row of each hot entry
        self.hot_weight = torch.zeros(H, dim, dtype=torch.float32, device=dev)
        kind = self.optimizer.kind
        self.hot_state = (
            None if kind == "sgd"
            else torch.zeros(H, dim, device=dev) if kind == "adagrad"
            else torch.zeros(H, device=dev)
        )  # fmt: skip
        self._device_dirty = torch.zeros(
            H, dtype=torch.bool, device=dev
        )  # updated on device since sync
        self._host_dirty = torch.zeros(H, dtype=torch.bool)  # updated on host since sync
        self._placeholder = torch.zeros(0, device=dev, requires_grad=True)
        self.refresh_device()

    def _host_rows(self, gid: torch.Tensor, state: bool) -> torch.Tensor:
        flat = self._s_flat if state else self._w_flat
        if flat is not None:
            return flat.index_select(0, gid)
        views = self.host.optimizer_states() if state else self.host.table_weights()
        table = torch.bucketize(gid, self._row_base, right=True) - 1
        out = torch.empty((gid.numel(), *views[0].shape[1:]), dtype=views[0].dtype)
        for t in torch.unique(
            table
        ).tolist():  # per table, vectorised within (non-contiguous layouts)
            sel = torch.nonzero(table == t).squeeze(1)
            out[sel] = views[t].index_select(0, gid[sel] - self._row_base[t])
        return out

    def _set_host_rows(self, gid: torch.Tensor, values: torch.Tensor, state: bool) -> None:
        flat = self._s_flat if state else self._w_flat
        with torch.no_grad():
            if flat is not None:
                flat.index_copy_(0, gid, values)
                return
            views = self.host.optimizer_states() if state else self.host.table_weights()
            table = torch.bucketize(gid, self._row_base, right=True) - 1
            for t in torch.unique(table).tolist():
                sel = torch.nonzero(table == t).squeeze(1)
                views[t].index_copy_(0, gid[sel] - self._row_base[t], values[sel])

    @torch.no_grad()
    def refresh_device(self) -> None:
        """Copy every hot row (weights + state) host -> device, e.g. after loading a state dict."""
        if not self.num_hot:
            return
        self.hot_weight.copy_(self._host_rows(self._hot_gid, False).to(self.device))
        if self.hot_state is not None:
            self.hot_state.copy_(self._host_rows(self._hot_gid, True).to(self.device))
        self._device_dirty.zero_()
        self._host_dirty.zero_()
        self._device_ahead = self._host_ahead = False

    @torch.no_grad()
    def _sync_to_host(self) -> None:
        t0 = time.perf_counter()
        rows = torch.nonzero(self._device_dirty).squeeze(1)
        gid = self._hot_gid[rows.cpu()]
        self._set_host_rows(gid, self.hot_weight.index_select(0, rows).cpu(), False)
        if self.hot_state is not None:
            self._set_host_rows(gid, self.hot_state.index_select(0, rows).cpu(), True)
        self._device_dirty.zero_()
        self._device_ahead = False
        self.stats.emb_bytes_d2h_sync += rows.numel() * self._row_bytes
        self.stats.sync_rows += rows.numel()
        self.stats.syncs += 1
        self.stats.sync_s += time.perf_counter() - t0

    @torch.no_grad()
    def _sync_to_device(self) -> None:
        t0 = time.perf_counter()
        rows = torch.nonzero(self._host_dirty).squeeze(1)
        gid = self._hot_gid[rows]
        rows_dev = rows.to(self.device)
        self.hot_weight.index_copy_(0, rows_dev, self._host_rows(gid, False).to(self.device))
        if self.hot_state is not None:
            self.hot_state.index_copy_(0, rows_dev, self._host_rows(gid, True).to(self.device))
        self._host_dirty.zero_()
        self._host_ahead = False
        self.stats.emb_bytes_h2d_sync += rows.numel() * self._row_bytes
        self.stats.sync_rows += rows.numel()
        self.stats.syncs += 1
        self.stats.sync_s += time.perf_counter() - t0

    def sync(self) -> None:
        """Bring both tiers up to date (before evaluation, checkpoints and exports)."""
        if self._device_ahead:
            self._sync_to_host()
        if self._host_ahead:
            self._sync_to_device()

    # --- classification -----------------------------------------------------------------------

    def _ordered(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        if features.keys() != self.feature_names:
            features = features.permute([features.keys().index(f) for f in self.feature_names])
        return features

    def _hot_index(self, values: torch.Tensor, lengths: torch.Tensor, batch: int) -> torch.Tensor:
        per_table = lengths.view(len(self.tables), batch).sum(1)
        base = self._row_base.to(values.device)
        gid = values.long() + base.repeat_interleave(per_table, output_size=values.numel())
        return self._remap[values.device][gid]

    def hot_input_mask(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """bool [batch]: inputs whose lookups (every feature) are all hot rows."""
        features = self._ordered(features)
        batch = features.stride()
        if not self.num_hot:
            return torch.zeros(batch, dtype=torch.bool)
        lengths = features.lengths().cpu().long()
        values = features.values().cpu()
        cold = (self._hot_index(values, lengths, batch) < 0).to(torch.int64)
        owner = (
            torch.arange(lengths.numel())
            .remainder(batch)
            .repeat_interleave(lengths, output_size=values.numel())
        )
        return torch.zeros(batch, dtype=torch.int64).index_add_(0, owner, cold) == 0

    # --- the collection contract --------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        features = self._ordered(features)
        batch = features.stride()
        values, offsets = features.values(), features.offsets()
        if values.dtype != offsets.dtype:
            values, offsets = values.long(), offsets.long()
        training = self.training and torch.is_grad_enabled()
        hidx = None
        if self.num_hot:
            hidx = self._hot_index(values, features.lengths().long(), batch)
            if bool((hidx >= 0).all()):
                pooled = self._hot_forward(hidx, offsets.to(self.device), batch, training)
                return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=pooled)
        pooled = self._cold_forward(values, offsets, hidx, training)
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=pooled)

    def _hot_forward(self, hidx, offsets, batch, training) -> torch.Tensor:
        if self._host_ahead:
            self._sync_to_device()
        hidx = hidx.to(self.device).long()
        offsets = offsets.long()
        if training:
            pooled = FusedLookup.apply(self._placeholder, _HotTable(self), hidx, offsets)
            self._count("hot", batch)
        else:
            pooled = F.embedding_bag(hidx, self.hot_weight, offsets[:-1], mode="sum")
        T, dim = len(self.tables), self.dims[0]
        return pooled.view(T, batch, dim).transpose(0, 1).reshape(batch, T * dim)

    def _cold_forward(self, values, offsets, hidx, training) -> torch.Tensor:
        if self._device_ahead:
            self._sync_to_host()
        pooled = self.host._impl(values.cpu(), offsets.cpu())
        if not training:
            return pooled.to(self.device)
        if (
            hidx is not None
        ):  # the host is about to update these hot rows: the device copy goes stale
            touched = hidx[hidx >= 0].cpu().long()
            if touched.numel():
                self._host_dirty.index_fill_(0, touched, True)
                self._host_ahead = True
        self._count("cold", pooled.shape[0])
        return _ToDevice.apply(pooled, self.device, self.stats)

    def _count(self, phase: str, batch: int) -> None:
        self.last_phase = phase
        self.stats.train_inputs += batch
        if phase == "hot":
            self.stats.hot_batches += 1
            self.stats.hot_inputs += batch
        else:
            self.stats.cold_batches += 1

    def set_learning_rate(self, lr: float) -> None:
        self.lr = float(lr)
        self.host.set_learning_rate(lr)

    def table_weights(self) -> list[torch.Tensor]:
        """Every table, full and current (host-tier views, after a sync). Writing into them?
        Call `refresh_device()` afterwards."""
        self.sync()
        return self.host.table_weights()

    def optimizer_states(self) -> list[torch.Tensor | None]:
        self.sync()
        return self.host.optimizer_states()

    def sparse_state_dict(self) -> dict[str, torch.Tensor]:
        self.sync()
        return self.host.sparse_state_dict()

    def load_sparse_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.sync()
        self.host.load_sparse_state_dict(state)
        self.refresh_device()

    def transfer_stats(self) -> dict:
        return self.stats.as_dict()

    def placement_info(self) -> dict:
        info = {
            "kind": "fae" if self.num_hot else "host",
            "backend": self.backend,
            "hot_rows": self.num_hot,
            "device_tier_bytes": self.num_hot * self._row_bytes,
            "host_tier_bytes": sum(t.num_embeddings for t in self.tables) * self._row_bytes,
        }
        if self.plan is not None:
            info["device_budget"] = self.plan.device_budget
            info["plan_hot_input_share_sample"] = self.plan.report.get("hot_input_share")
            info["plan_hot_lookup_share_sample"] = self.plan.report.get("hot_lookup_share")
        return info

    # --- placement-independent state dict -----------------------------------------------------

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: D401
        self.sync()
        self.host._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        self.sync()
        self.host._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self.refresh_device()
