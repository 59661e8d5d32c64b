"""FAE's hot/cold embeddings (Adnan et al., VLDB 2022), behind the embedding-collection contract.

Two tiers (embeddings/memory_tiers.py):
- the host tier holds every row of every table (weights + optimizer state) in host memory, as a
  `FusedEmbeddingBagCollection` on the CPU (fbgemm's CPU kernels where available);
- the device tier holds the plan's hot rows, all tables in one [hot rows, dim] table (and its
  optimizer state) on the training device, looked up with PyTorch's own ops (the CUDA fbgemm
  wheel is not assumed); it is a replica of those rows of the host tier.

A mini-batch is *hot* when every input is all hot (embeddings/hot_inputs.py, the rule the
scheduler and the plan's report use): it runs entirely on the device tier (no embedding bytes
cross PCIe). Any other mini-batch is *cold*: it is pooled on the host tier, and the pooled
embeddings go to the device and their gradients come back. Each tier is authoritative for the
rows it last updated; before a tier is read it receives, in one vectorised copy, the hot rows the
other tier changed since the last sync (weights AND optimizer state). `sync()` brings both up to
date; exports (`state_dict`, `table_weights`, `optimizer_states`, `sparse_state_dict`) sync first,
so they are the full, current tables whatever the placement.

With `plan=None` it is the host-only placement: every lookup on the host tier, pooled
embeddings transferred (the CPU-GPU hybrid baseline of the FAE paper).
"""

from __future__ import annotations

import logging

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embeddings.collection import EmbeddingCollection
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError
from embeddings.hot_inputs import AllHotClassifier
from embeddings.kjt_ops import in_feature_order
from embeddings.memory_tiers import DeviceTier, HostTier, Replica
from embeddings.plan import ALL, PlacementPlan, row_bytes
from embeddings.transfer_stats import TransferStats

log = logging.getLogger(__name__)


class _ToDevice(torch.autograd.Function):
    """Pooled embeddings host -> device; gradients device -> host. Counts both (training only)."""

    @staticmethod
    def forward(ctx, pooled, device, stats: TransferStats):  # type: ignore[override]
        ctx.stats = stats
        stats.add_bytes("host", "device", "lookup", pooled.numel() * pooled.element_size())
        out = pooled.to(device, non_blocking=True)
        return pooled.view_as(pooled) if out is pooled else out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.stats.add_bytes("device", "host", "lookup", grad.numel() * grad.element_size())
        return grad.to("cpu"), None, None


class FAEEmbeddingBagCollection(EmbeddingCollection):
    """FAE hot/cold embeddings (or host-only with `plan=None`)."""

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
        self.device = torch.device(device or "cpu")
        self.plan = plan
        self.stats = TransferStats()
        self._last_kind: str | None = None
        sizes = [t.num_embeddings for t in tables]
        self.num_hot = 0
        if plan is not None:
            plan.check_fits(self.feature_names, sizes, self.dims, optimizer.kind, "placement plan")
            if not plan.replicated or plan.tier("host").rows != ALL:
                raise PlacementError(
                    "placement plan: FAE keeps the hot rows' master copy on the host, so the "
                    "plan's host tier must hold every row (a replicated plan, not one home per row)"
                )
            self.num_hot = plan.num_hot
        if self.num_hot and len(set(self.dims)) != 1:
            raise ValueError(
                "fae placement: the hot table needs every embedding table to have the same width"
            )
        self._row_bytes = row_bytes(self.dims[0], optimizer)
        self.host = HostTier(tables, optimizer, None, host_backend, seed)
        self.backend = f"fae(host={self.host.backend}, device=torch)"
        self.hot: DeviceTier | None = None
        self.replica: Replica | None = None
        self.classifier: AllHotClassifier | None = None
        if self.num_hot:
            self.classifier = AllHotClassifier(plan)
            hot_t, hot_r = plan.hot_ids()
            slot_gid = torch.from_numpy(hot_r) + self.host.row_base[torch.from_numpy(hot_t)]
            self.hot = DeviceTier(slot_gid, self.dims[0], optimizer, self.device)
            self.replica = Replica(self.hot, self.host, self.stats)
            self.replica.refresh()

    # --- lookups --------------------------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        features = in_feature_order(features, self.feature_names)
        batch = features.stride()
        values, offsets = features.values(), features.offsets()
        if values.dtype != offsets.dtype:
            values, offsets = values.long(), offsets.long()
        training = self.training and torch.is_grad_enabled()
        slots = None
        if self.classifier is not None:
            lengths = features.lengths().long()
            slots = self.classifier.slots(values, lengths, batch)
            if bool(self.classifier.mask(values, lengths, batch, slots).all()):
                pooled = self._hot_forward(slots, offsets.to(self.device), batch, training)
                return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=pooled)
        pooled = self._cold_forward(values, offsets, slots, training)
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=pooled)

    def _hot_forward(self, slots, offsets, batch, training) -> torch.Tensor:
        if self.replica.slow_ahead:
            self.replica.pull()
        pooled = self.hot.pool(slots.to(self.device).long(), offsets.long(), training)
        if training:
            self._count("hot", batch)
        T, dim = len(self.tables), self.dims[0]
        return pooled.view(T, batch, dim).transpose(0, 1).reshape(batch, T * dim)

    def _cold_forward(self, values, offsets, slots, training) -> torch.Tensor:
        if self.replica is not None and self.replica.fast_ahead:
            self.replica.push()
        pooled = self.host.pool(values.cpu(), offsets.cpu())
        if not training:
            return pooled.to(self.device)
        if (
            slots is not None
        ):  # the host is about to update these hot rows: the device copy goes stale
            self.replica.slow_updated(slots[slots >= 0].cpu().long())
        self._count("cold", pooled.shape[0])
        return _ToDevice.apply(pooled, self.device, self.stats)

    def _count(self, kind: str, batch: int) -> None:
        self._last_kind = kind
        self.stats.train_inputs += batch
        if kind == "hot":
            self.stats.hot_batches += 1
            self.stats.hot_inputs += batch
        else:
            self.stats.cold_batches += 1

    def last_step_kind(self) -> str | None:
        return self._last_kind

    def set_learning_rate(self, lr: float) -> None:
        self.host.set_learning_rate(lr)
        if self.hot is not None:
            self.hot.lr = float(lr)

    # --- full tables: the host tier's, after a sync ---------------------------------------------

    def sync(self) -> None:
        """Bring both tiers up to date (before evaluation, checkpoints and exports)."""
        if self.replica is not None:
            self.replica.sync()

    def table_weights(self) -> list[torch.Tensor]:
        self.sync()
        return self.host.collection.table_weights()

    def optimizer_states(self) -> list[torch.Tensor | None]:
        self.sync()
        return self.host.collection.optimizer_states()

    def after_tables_written(self) -> None:
        """Every hot row host -> device (the host tier's rows were written from outside)."""
        if self.replica is not None:
            self.replica.refresh()

    # --- counters, summaries, checkpoints -------------------------------------------------------

    def counters(self) -> dict:
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
            info["plan_source"] = self.plan.report.get("source")
            info["plan_hot_input_share_sample"] = self.plan.report.get("hot_input_share")
            info["plan_hot_lookup_share_sample"] = self.plan.report.get("hot_lookup_share")
        return info

    def extra_state(self) -> dict[str, torch.Tensor]:
        """The transfer counters, so a resumed run's metrics continue where they were."""
        return {"placement_stats": self.stats.state_tensor()}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        unknown = sorted(k for k in state if k != "placement_stats")
        if unknown:
            raise KeyError(f"fae embeddings: unexpected checkpoint state {', '.join(unknown[:3])}")
        if "placement_stats" in state:
            self.stats.load_state_tensor(state["placement_stats"])
