"""Hotline's embeddings (Adnan et al., ISCA 2024), behind the embedding-collection contract.

One home per row (embeddings/tiers.py):
- the device tier holds the plan's hot rows (weights + optimizer state) in one [hot rows, dim]
  table on the training device, looked up and updated with PyTorch's own ops;
- the host tier holds every other row with its state (a `HostTier` of the plan's `rest`), and is
  their only copy: a `ColdRowSource` that serves rows by id and trains them itself.
No row lives in two tiers, so nothing is ever synced.

A training step's cold rows are *staged*: deduplicated, gathered from the host tier and copied to
the device (`stage`; the Hotline train pipeline does it ahead, on a worker). Lookups then read hot
rows from the device tier and cold rows from the staged copy. Backward sums each row's gradient
over its lookups: the hot rows are updated on the device, the cold rows' gradients go back to
the host tier, whose optimizer updates the rows and their state in place. That happens in
backward, or, inside `deferred_updates()`, once after every backward of the step (Hotline's
popular and non-popular micro-batches make one optimizer step). A staged copy gathered before a
write-back of some of its rows is refreshed before use (`refresh_staged`), so it is never stale.

Without staged rows (evaluation, the plain train pipeline) forward gathers the cold rows itself.
With `plan=None` every row starts on the host; `observe` counts accesses and `adopt(plan)` moves
the plan's hot rows to the device (Hotline's online popularity).
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embeddings.collection import EmbeddingCollection
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError, TierError
from embeddings.fused import uniform_table
from embeddings.hot_inputs import all_hot_inputs
from embeddings.kjt_ops import in_feature_order
from embeddings.plan import PlacementPlan, row_bytes
from embeddings.tiers import DeviceTier, HostTier, table_row_base
from embeddings.transfer_stats import TransferStats

FLOAT = 4
# write-backs remembered for refreshing staged rows; a staging older than this is gathered again
WRITEBACK_LOG = 16


@dataclass
class StagedRows:
    """One step's cold rows on the device: `weight[i]` is global row `gids[i]` (sorted, unique)."""

    gids: torch.Tensor  # int64, CPU
    weight: torch.Tensor  # [n, dim] float32 on the training device
    version: int  # write-backs the host tier had received when the gather began
    seconds: float = 0.0  # the gather's own time
    ready: torch.cuda.Event | None = None  # CUDA: recorded on the side stream after the copy

    @property
    def rows(self) -> int:
        return self.gids.numel()


class _Lookup(torch.autograd.Function):
    """Sum-pooled bags over hot slots (device tier) and staged cold rows; backward hands each
    tier its rows' summed gradients (`HotlineEmbeddingBagCollection._take_gradients`)."""

    @staticmethod
    def forward(ctx, placeholder, coll, slots, cold, cold_idx, cold_gid, offsets, staged_w):  # type: ignore[override]
        ctx.coll = coll
        ctx.save_for_backward(slots, cold, cold_idx, cold_gid, offsets)
        return coll._pool(slots, cold, cold_idx, offsets, staged_w)

    @staticmethod
    def backward(ctx, grad_bags):  # type: ignore[override]
        slots, cold, cold_idx, cold_gid, offsets = ctx.saved_tensors
        lengths = offsets[1:] - offsets[:-1]
        per_lookup = grad_bags.float().repeat_interleave(lengths, dim=0, output_size=slots.numel())
        ctx.coll._take_gradients(slots, cold, cold_gid, per_lookup)
        return (None,) * 8


def sum_rows(rows: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique rows, the summed gradient of each)."""
    unique, inverse = torch.unique(rows, return_inverse=True)
    out = torch.zeros(unique.numel(), grads.shape[1], dtype=grads.dtype, device=grads.device)
    out.index_add_(0, inverse, grads)
    return unique, out


class HotlineEmbeddingBagCollection(EmbeddingCollection):
    """Hot rows on the device, every other row only on the host, cold rows staged per step."""

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
        if len(set(self.dims)) != 1:
            raise ValueError(
                "hotline placement: the hot table needs every embedding table to have the same width"
            )
        self.dim = self.dims[0]
        self.optimizer = optimizer
        self.lr = optimizer.learning_rate
        self.device = torch.device(device or "cpu")
        self.seed, self.host_backend = seed, host_backend
        self.sizes = [t.num_embeddings for t in tables]
        self.row_base = table_row_base(self.sizes)
        self.total_rows = sum(self.sizes)
        self.stats = TransferStats()
        self._row_bytes = row_bytes(self.dim, optimizer)
        self._placeholder = torch.zeros(0, device=self.device, requires_grad=True)
        self._side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._deferred = False
        self._pending_hot: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._pending_cold: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._staged: StagedRows | None = None
        self.version = 0  # write-backs so far
        self._writebacks: deque[tuple[int, torch.Tensor]] = deque(maxlen=WRITEBACK_LOG)
        self._export: dict[str, list[torch.Tensor]] = {}
        self.learn_counts: torch.Tensor | None = None  # accesses per global row while learning
        self.learned_batches = 0
        self.plan: PlacementPlan | None = None
        if plan is None:
            self.host = HostTier(tables, optimizer, None, host_backend, seed)
            self._set_device_tier(torch.zeros(0, dtype=torch.int64))
        else:
            plan = self._one_home(plan)
            self.host = HostTier(tables, optimizer, plan.tier_remaps("host"), host_backend, seed)
            self._set_device_tier(self._hot_gids(plan), initial=True)
            self.plan = plan
        self.backend = f"hotline(host={self.host.backend}, device=torch)"

    # --- tiers ------------------------------------------------------------------------------------

    def _one_home(self, plan: PlacementPlan) -> PlacementPlan:
        plan.check_fits(
            self.feature_names, self.sizes, self.dims, self.optimizer.kind, "placement plan"
        )
        if plan.replicated:  # e.g. an FAE plan: the same hot rows, the host holding the rest
            plan = PlacementPlan.device_and_host(
                plan.feature_names, plan.table_sizes, plan.dims, plan.optimizer, plan.remaps,
                plan.device_budget, plan.host_budget, plan.report, one_home=True,
            )  # fmt: skip
        if plan.tier_names != ["device", "host"]:
            raise PlacementError(
                f"placement plan: hotline needs a device and a host tier, not {plan.tier_names}"
            )
        return plan

    def _hot_gids(self, plan: PlacementPlan) -> torch.Tensor:
        hot_t, hot_r = plan.hot_ids()
        return torch.from_numpy(hot_r) + self.row_base[torch.from_numpy(hot_t)]

    def _set_device_tier(self, slot_gid: torch.Tensor, initial: bool = False) -> None:
        """The device tier for these rows, and the remap global row -> device slot (-1 = host)."""
        self.hot = DeviceTier(slot_gid, self.dim, self.optimizer, self.device)
        self.hot.lr = self.lr
        remap = torch.full((self.total_rows,), -1, dtype=torch.int32)  # hot rows < 2**31
        remap[slot_gid] = torch.arange(slot_gid.numel(), dtype=torch.int32)
        self.remap = remap
        if initial and slot_gid.numel():  # the values the full tables' seeded init gives them
            table = torch.bucketize(slot_gid, self.row_base, right=True) - 1
            with torch.no_grad():
                for t in torch.unique(table).tolist():
                    sel = torch.nonzero(table == t).squeeze(1)
                    full = uniform_table(self.sizes[t], self.dim, t, self.seed)
                    rows = slot_gid[sel] - self.row_base[t]
                    self.hot.weight[sel.to(self.device)] = full[rows].to(self.device)

    @property
    def num_hot(self) -> int:
        return self.hot.num_rows

    # --- lookups --------------------------------------------------------------------------------

    def global_ids(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """Each lookup's global row id (CPU int64), table-major in feature order."""
        features = in_feature_order(features, self.feature_names)
        values = features.values().cpu().long()
        per_table = features.lengths().cpu().long().view(len(self.tables), -1).sum(1)
        return values + self.row_base.repeat_interleave(per_table, output_size=values.numel())

    def popular_steps(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """bool [stride] on the CPU: the inputs (KJT rows) whose every lookup is a device row
        (the one all-hot rule, embeddings/hot_inputs.py)."""
        features = in_feature_order(features, self.feature_names)
        values, lengths = features.values().cpu(), features.lengths().cpu().long()
        return all_hot_inputs(self.remap, self.row_base, values, lengths, features.stride())

    def cold_ids(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """The sorted unique host rows these lookups read."""
        gid = self.global_ids(features)
        return torch.unique(gid[self.remap[gid] < 0])

    @torch.no_grad()
    def stage(self, gids: torch.Tensor, version: int | None = None) -> StagedRows:
        """Gather rows `gids` (sorted, unique) from the host tier onto the device. Thread-safe
        (counts nothing itself; the caller counts when it uses the rows). `version`: the
        write-backs the host had received when the caller decided to gather (default: now)."""
        version = self.version if version is None else version
        t0 = time.perf_counter()
        rows = self.host.gather(gids) if gids.numel() else torch.zeros(0, self.dim)
        ready = None
        if self._side is not None:  # pinned host rows, copied on a side stream
            with torch.cuda.stream(self._side):
                weight = rows.pin_memory().to(self.device, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(self._side)
        else:
            weight = rows
        return StagedRows(gids, weight, version, time.perf_counter() - t0, ready)

    def refresh_staged(self, staged: StagedRows) -> int:
        """Re-gather the staged rows the host tier has updated since their gather began (a
        prefetched row the previous step wrote back); returns how many. Main thread only."""
        if staged.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(staged.ready)
            staged.ready = None
        if staged.version == self.version or not staged.rows:
            staged.version = self.version
            return 0
        oldest = self._writebacks[0][0] if self._writebacks else self.version + 1
        if staged.version + 1 < oldest:  # older than the log: every row again
            pos = torch.arange(staged.rows)
        else:
            changed = torch.cat([g for v, g in self._writebacks if v > staged.version])
            pos = torch.nonzero(torch.isin(staged.gids, changed)).squeeze(1)
        if pos.numel():
            fresh = self.host.gather(staged.gids[pos]).to(self.device)
            staged.weight[pos.to(self.device)] = fresh
            self.stats.add_bytes("host", "device", "gather", pos.numel() * self.dim * FLOAT)
        staged.version = self.version
        return int(pos.numel())

    @contextmanager
    def using(self, staged: StagedRows):
        """Forward reads cold rows from `staged` (refreshed first) instead of gathering them."""
        self.refresh_staged(staged)
        self._staged = staged
        try:
            yield
        finally:
            self._staged = None

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        features = in_feature_order(features, self.feature_names)
        batch = features.stride()
        training = self.training and torch.is_grad_enabled()
        gid = self.global_ids(features)
        slots = self.remap[gid].long()
        cold = slots < 0
        staged, cold_gid = self._staged, gid[cold]
        if cold_gid.numel() and staged is None:  # nothing staged: gather now
            staged = self.stage(torch.unique(cold_gid))
            if training:
                self._count_staging(staged, staged.seconds)
        cold_idx = torch.zeros(0, dtype=torch.int64)
        if cold_gid.numel():
            cold_idx = torch.searchsorted(staged.gids, cold_gid)
            found = staged.rows > 0 and bool(
                (staged.gids[cold_idx.clamp(max=max(staged.rows - 1, 0))] == cold_gid).all()
            )
            if not found:
                raise TierError("hotline: a cold row of this batch is missing from the staged rows")
        if training:
            self._export.clear()  # exported tables are stale from now on
            self.stats.train_inputs += batch
        dev = self.device
        offsets = features.offsets().to(dev).long()
        staged_w = staged.weight if staged is not None else self.hot.weight[:0]
        args = (slots.to(dev), cold.to(dev), cold_idx.to(dev), cold_gid, offsets, staged_w)
        if training:
            pooled = _Lookup.apply(self._placeholder, self, *args)
        else:
            with torch.no_grad():
                pooled = self._pool(*args[:3], offsets, staged_w)
        T = len(self.tables)
        values = pooled.view(T, batch, self.dim).transpose(0, 1).reshape(batch, T * self.dim)
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=values)

    def _pool(self, slots, cold, cold_idx, offsets, staged_w) -> torch.Tensor:
        """Bags summed from the device tier's rows and the staged ones: each lookup's row is
        weighted 1 in the table it lives in and 0 in the other (exact: x + 0 == x)."""
        bags = offsets[:-1]
        n_cold = cold_idx.numel()
        if n_cold == 0:
            return F.embedding_bag(slots, self.hot.weight, bags, mode="sum")
        idx = torch.zeros_like(slots)
        idx[cold] = cold_idx
        pooled = F.embedding_bag(idx, staged_w, bags, mode="sum", per_sample_weights=cold.float())
        if n_cold < slots.numel():
            hot = (~cold).float()
            pooled = pooled + F.embedding_bag(
                slots.clamp(min=0), self.hot.weight, bags, mode="sum", per_sample_weights=hot
            )
        return pooled

    def _take_gradients(self, slots, cold, cold_gid, per_lookup) -> None:
        """Keep each lookup's gradient; `apply_updates` sums them per row once for the step."""
        if cold_gid.numel() < slots.numel():
            hot = ~cold
            self._pending_hot.append((slots[hot], per_lookup[hot]))
        if cold_gid.numel():
            self._pending_cold.append((cold_gid.to(per_lookup.device), per_lookup[cold]))
        if not self._deferred:
            self.apply_updates()

    # --- updates ----------------------------------------------------------------------------------

    @contextmanager
    def deferred_updates(self):
        """Backward passes inside only collect gradients; `apply_updates()` on leaving applies
        them once (one optimizer step for several micro-batches)."""
        self._deferred = True
        try:
            yield
        except BaseException:
            self._pending_hot, self._pending_cold = [], []  # a failed step updates nothing
            raise
        finally:
            self._deferred = False
        self.apply_updates()

    @torch.no_grad()
    def apply_updates(self) -> None:
        hot, cold = self._pending_hot, self._pending_cold
        self._pending_hot, self._pending_cold = [], []
        if hot:
            self.hot.update(*sum_rows(*map(torch.cat, zip(*hot))))
        if cold:
            gids, grad = sum_rows(*map(torch.cat, zip(*cold)))
            gids, grad = gids.cpu(), grad.cpu()
            self.stats.add_bytes("device", "host", "writeback", grad.numel() * FLOAT)
            self.host.apply_gradients(gids, grad, self.lr)
            self.version += 1
            self._writebacks.append((self.version, gids))

    def set_learning_rate(self, lr: float) -> None:
        self.lr = float(lr)
        self.hot.lr = float(lr)

    # --- counters of a Hotline step (the pipeline reports what forward cannot see) ----------------

    def _count_staging(self, staged: StagedRows, waited_s: float) -> None:
        s = self.stats
        s.add_bytes("host", "device", "gather", staged.rows * self.dim * FLOAT)
        s.cold_rows += staged.rows
        s.gather_s += staged.seconds
        s.exposed_gather_s += waited_s

    def count_step(self, popular_inputs: int, staged: StagedRows | None, waited_s: float) -> None:
        """One Hotline mini-batch: its popular inputs and its staged cold rows (gathered ahead;
        `waited_s` is how long the step waited for them)."""
        self.stats.hotline_batches += 1
        self.stats.popular_inputs += popular_inputs
        if staged is not None:
            self._count_staging(staged, waited_s)

    # --- online popularity ------------------------------------------------------------------------

    def observe(self, features: KeyedJaggedTensor) -> None:
        """Count this batch's accesses (before a plan is adopted)."""
        if self.learn_counts is None:
            self.learn_counts = torch.zeros(self.total_rows, dtype=torch.int32)
        gid = self.global_ids(features)
        self.learn_counts.index_add_(0, gid, torch.ones(gid.numel(), dtype=torch.int32))
        self.learned_batches += 1

    def learned_counts(self) -> list[np.ndarray]:
        """The observed accesses per table (for `AccessProfile`)."""
        counts = (
            self.learn_counts if self.learn_counts is not None else torch.zeros(self.total_rows)
        )
        c = counts.numpy().astype(np.int64)
        return [c[b : b + n] for b, n in zip(self.row_base.tolist(), self.sizes)]

    @torch.no_grad()
    def adopt(self, plan: PlacementPlan) -> None:
        """Move the plan's hot rows (weights and state) to the device tier, the host keeping the
        rest, one table at a time (the host's copy is rebuilt without the hot rows)."""
        if self.plan is not None:
            raise PlacementError("hotline: a plan was already adopted")
        plan = self._one_home(plan)
        gids = self._hot_gids(plan)
        weights, state = self.host.read_rows(gids)
        old = self.host
        self.host = HostTier(
            self.tables, self.optimizer, plan.tier_remaps("host"), self.host_backend, self.seed
        )
        self.host.set_learning_rate(self.lr)
        for t, r in enumerate(plan.tier_remaps("host")):
            rest = torch.from_numpy(np.flatnonzero(r >= 0)) + self.row_base[t]
            if rest.numel():
                self.host.write_rows(rest, *old.read_rows(rest))
        del old
        self._set_device_tier(gids)
        self.hot.weight.copy_(weights.to(self.device))
        if state is not None:
            self.hot.state.copy_(state.to(self.device))
        self.stats.add_bytes("host", "device", "sync", gids.numel() * self._row_bytes)
        self.plan = plan
        self.learn_counts = None
        self._export.clear()
        self._writebacks.clear()
        self.version += 1  # every staging from before is stale

    # --- full tables, assembled from both tiers ---------------------------------------------------

    def _assemble(self, state: bool) -> list[torch.Tensor | None]:
        if state and self.optimizer.kind == "sgd":
            return [None] * len(self.tables)
        host_views = (
            self.host.collection.optimizer_states()
            if state
            else self.host.collection.table_weights()
        )
        dev = self.hot.state if state else self.hot.weight
        out = []
        for t, n in enumerate(self.sizes):
            base = int(self.row_base[t])
            slots = self.remap[base : base + n]
            shape = (n, self.dim) if (not state or self.optimizer.kind == "adagrad") else (n,)
            full = torch.empty(shape, dtype=torch.float32)
            hot_rows = torch.nonzero(slots >= 0).squeeze(1)
            cold_rows = torch.nonzero(slots < 0).squeeze(1)  # the host's slot order is row order
            full[cold_rows] = host_views[t][: cold_rows.numel()]
            if hot_rows.numel():
                full[hot_rows] = dev[slots[hot_rows].long().to(dev.device)].cpu()
            out.append(full)
        return out

    @torch.no_grad()
    def _write_back_export(self, name: str, full: list[torch.Tensor]) -> None:
        state = name == "state"
        host_views = (
            self.host.collection.optimizer_states()
            if state
            else self.host.collection.table_weights()
        )
        dev = self.hot.state if state else self.hot.weight
        for t, n in enumerate(self.sizes):
            base = int(self.row_base[t])
            slots = self.remap[base : base + n]
            hot_rows = torch.nonzero(slots >= 0).squeeze(1)
            cold_rows = torch.nonzero(slots < 0).squeeze(1)
            host_views[t][: cold_rows.numel()] = full[t][cold_rows]
            if hot_rows.numel():
                dev[slots[hot_rows].long().to(dev.device)] = full[t][hot_rows].to(dev.device)

    def table_weights(self) -> list[torch.Tensor]:
        """Copies of the full tables (rows come from two tiers): after writing into them call
        `after_tables_written()`, which stores them back."""
        self._export["weight"] = self._assemble(False)
        return self._export["weight"]

    def optimizer_states(self) -> list[torch.Tensor | None]:
        out = self._assemble(True)
        if out[0] is not None:
            self._export["state"] = out
        return out

    def after_tables_written(self) -> None:
        for name, full in list(self._export.items()):
            self._write_back_export(name, full)
        self._export.clear()
        self.version += 1  # staged copies of the old values are stale
        self._writebacks.clear()

    # --- counters, summaries, checkpoints -------------------------------------------------------

    def counters(self) -> dict:
        return self.stats.as_dict()

    def placement_info(self) -> dict:
        info = {
            "kind": "hotline",
            "backend": self.backend,
            "hot_rows": self.num_hot,
            "device_tier_bytes": self.num_hot * self._row_bytes,
            "host_tier_bytes": (self.total_rows - self.num_hot) * self._row_bytes,
            "learned_batches": self.learned_batches,
        }
        if self.plan is not None:
            info["device_budget"] = self.plan.device_budget
            info["plan_hot_input_share_sample"] = self.plan.report.get("hot_input_share")
            info["plan_hot_lookup_share_sample"] = self.plan.report.get("hot_lookup_share")
        return info

    def extra_state(self) -> dict[str, torch.Tensor]:
        """The transfer counters, and while popularity is being learned its counts so far."""
        out = {"placement_stats": self.stats.state_tensor()}
        if self.plan is None and self.learned_batches:
            out["learn_counts"] = self.learn_counts.clone()
            out["learned_batches"] = torch.tensor(self.learned_batches)
        return out

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        known = {"placement_stats", "learn_counts", "learned_batches"}
        unknown = sorted(k for k in state if k not in known)
        if unknown:
            raise KeyError(
                f"hotline embeddings: unexpected checkpoint state {', '.join(unknown[:3])}"
            )
        if "placement_stats" in state:
            self.stats.load_state_tensor(state["placement_stats"])
        if "learn_counts" in state and self.plan is None:
            counts = state["learn_counts"]
            if counts.numel() != self.total_rows:
                raise ValueError(
                    f"hotline learned counts: {counts.numel()} rows, expected {self.total_rows}"
                )
            self.learn_counts = counts.to(torch.int32).clone()
            self.learned_batches = int(state["learned_batches"])
