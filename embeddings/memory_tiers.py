"""Tiers: where a placement's rows are stored, and the bookkeeping that keeps replicas current.

- `DeviceTier`: rows in one dense [rows, dim] tensor (+ optimizer state) on a torch device,
  looked up with PyTorch's own ops (the CUDA fbgemm wheel is not assumed) and updated by the
  fused `apply_sparse_update`.
- `HostTier`: rows in a host `FusedEmbeddingBagCollection` (fbgemm's CPU kernels where
  available), gathered and scattered by global row id.
- `HostTier` is a `RowStore` (embeddings/row_store.py): rows and their optimizer state in and out
  by id, what a faster tier stages from and writes back to (FAE's replica syncs; a staged
  collection's cold rows, whose only home it is).
- `Replica`: a fast tier's copies of some rows of a slower one (FAE's hot rows), each side
  authoritative for the rows it last updated; dirty rows travel in one vectorised copy.

Rows are named by *global row id*: tables back to back in feature order, global id =
first global row of the table + row. A tier holds the rows its plan assigns it (a per-table remap,
-1 = not here; FAE's host tier is assigned every row), and asking it for another is a TierError.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import TierError
from embeddings.fused import FusedEmbeddingBagCollection, uniform_table
from embeddings.hot_inputs import lookup_slots
from embeddings.plan import row_bytes
from embeddings.row_layout import flat_rows, table_row_base
from embeddings.row_store import RowStore
from embeddings.torch_tbe import FusedLookup, apply_sparse_update
from embeddings.transfer_stats import TransferStats


class HostTier(RowStore):
    """Rows in host memory, in a CPU `FusedEmbeddingBagCollection` (lookups with the fused
    optimizer in backward), plus gather/scatter by global row id for other tiers.

    `remaps=None`: the tier holds every row (its tables are the full tables). Otherwise
    `remaps[t][row]` is the row's slot in the tier (tables back to back, as a plan's explicit
    tiers), -1 = not here; the tier's table t then has only its held rows, initialised to the
    values the full table's seeded initialisation gives them.
    """

    name = "host"

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer,
        remaps: list[np.ndarray] | None = None,
        backend: str = "auto",
        seed: int = 0,
        init: bool = True,
    ) -> None:
        """`init=False`: the rows' values are left to the caller, who writes every one."""
        self.tables = list(tables)
        self.optimizer = optimizer
        self.seed, self.backend_name = seed, backend
        sizes = [t.num_embeddings for t in tables]
        self.row_base = table_row_base(sizes)
        self._remap: torch.Tensor | None = None  # global id -> slot, -1 = not here
        if remaps is None:
            held_tables, self.held = self.tables, sizes
        else:
            self.held = [int((r >= 0).sum()) for r in remaps]
            # a table of which the tier holds no row keeps one row no id maps to
            held_tables = [
                TableSpec(t.name, max(h, 1), t.embedding_dim, t.feature_name)
                for t, h in zip(tables, self.held)
            ]
        self.slot_base = table_row_base([t.num_embeddings for t in held_tables])
        if remaps is not None:  # the plan's slots -> rows of the collection's tables back to back
            plan_base = table_row_base(self.held).numpy()
            remap = np.concatenate([
                np.where(r >= 0, r.astype(np.int64) - pb + sb, -1)
                for r, pb, sb in zip(remaps, plan_base, self.slot_base.numpy())
            ])  # fmt: skip
            if sum(t.num_embeddings for t in held_tables) < 2**31:  # half the bytes to look up
                remap = remap.astype(np.int32)
            self._remap = torch.from_numpy(remap)
        self.collection = FusedEmbeddingBagCollection(
            held_tables, optimizer, device="cpu", backend=backend, seed=seed, init=init
        )
        self.backend = self.collection.backend
        if remaps is not None and init:
            self._init_held_rows(remaps, seed)
        self._w_flat = flat_rows(self.collection.table_weights())
        states = self.collection.optimizer_states()
        self._s_flat = None if states[0] is None else flat_rows(states)

    @torch.no_grad()
    def _init_held_rows(self, remaps: list[np.ndarray], seed: int) -> None:
        for t, (spec, r, w) in enumerate(zip(self.tables, remaps, self.collection.table_weights())):
            rows = np.flatnonzero(r >= 0)
            rows = rows[np.argsort(r[rows], kind="stable")]  # slot order
            full = uniform_table(spec.num_embeddings, spec.embedding_dim, t, seed)
            w[: rows.size].copy_(full[torch.from_numpy(rows)])

    def init_rows(self, table: int, rows: torch.Tensor, out: torch.Tensor) -> None:
        spec = self.tables[table]
        full = uniform_table(spec.num_embeddings, spec.embedding_dim, table, self.seed)
        out.copy_(full[rows])

    @torch.no_grad()
    def keep_only(self, remaps: list[np.ndarray]) -> HostTier:
        kept = HostTier(  # every row is written below
            self.tables, self.optimizer, remaps, self.backend_name, self.seed, init=False
        )
        for t, r in enumerate(remaps):
            rest = torch.from_numpy(np.flatnonzero(r >= 0)) + self.row_base[t]
            if rest.numel():
                kept.write_rows(rest, *self.read_rows(rest))
        return kept

    # --- lookups --------------------------------------------------------------------------------

    def pool(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Pooled embeddings [batch, sum dims] of table-major bags (row ids of each table); the
        fused optimizer updates the rows in backward."""
        if self._remap is not None:
            batch = (offsets.numel() - 1) // len(self.tables)
            lengths = offsets[1:] - offsets[:-1]
            slots = lookup_slots(self._remap, self.row_base, values, lengths, batch)
            self._check_held(slots, values, lengths, batch)
            per_table = lengths.view(len(self.tables), batch).sum(1)
            base = self.slot_base.repeat_interleave(per_table, output_size=values.numel())
            values = (slots - base).to(values.dtype)
        return self.collection.pooled(values, offsets)

    def set_learning_rate(self, lr: float) -> None:
        self.collection.set_learning_rate(lr)

    # --- rows by global id ----------------------------------------------------------------------

    def holds(self, ids: torch.Tensor) -> torch.Tensor:
        if self._remap is None:
            return torch.ones(ids.shape, dtype=torch.bool)
        return self._remap[ids] >= 0

    def _slots(self, ids: torch.Tensor) -> torch.Tensor:
        if self._remap is None:
            return ids
        slots = self._remap[ids]
        bad = torch.nonzero(slots < 0)
        if bad.numel():
            gid = int(ids[bad[0, 0]])
            t = int(torch.bucketize(torch.tensor(gid), self.row_base, right=True)) - 1
            raise TierError(
                f"host tier: row {gid - int(self.row_base[t])} of table {self.tables[t].name} "
                f"is not held here (its plan puts it in another tier)"
            )
        return slots.long()

    def _check_held(self, slots, values, lengths, batch) -> None:
        bad = torch.nonzero(slots < 0)
        if bad.numel():
            i = int(bad[0, 0])
            per_table = lengths.view(len(self.tables), batch).sum(1)
            t = int(torch.bucketize(torch.tensor(i), torch.cumsum(per_table, 0), right=True))
            raise TierError(
                f"host tier: row {int(values[i])} of table {self.tables[t].name} "
                f"is not held here (its plan puts it in another tier)"
            )

    def _views(self, state: bool) -> list[torch.Tensor]:
        c = self.collection
        return c.optimizer_states() if state else c.table_weights()

    def _gather(self, slots: torch.Tensor, state: bool) -> torch.Tensor:
        flat = self._s_flat if state else self._w_flat
        if flat is not None:
            return flat.index_select(0, slots)
        views = self._views(state)
        table = torch.bucketize(slots, self.slot_base, right=True) - 1
        out = torch.empty((slots.numel(), *views[0].shape[1:]), dtype=views[0].dtype)
        for t in torch.unique(table).tolist():  # per table, vectorised within
            sel = torch.nonzero(table == t).squeeze(1)
            out[sel] = views[t].index_select(0, slots[sel] - self.slot_base[t])
        return out

    def _scatter(self, slots: torch.Tensor, values: torch.Tensor, state: bool) -> None:
        flat = self._s_flat if state else self._w_flat
        if flat is not None:
            flat.index_copy_(0, slots, values)
            return
        views = self._views(state)
        table = torch.bucketize(slots, self.slot_base, right=True) - 1
        for t in torch.unique(table).tolist():
            sel = torch.nonzero(table == t).squeeze(1)
            views[t].index_copy_(0, slots[sel] - self.slot_base[t], values[sel])

    @torch.no_grad()
    def read_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        slots = self._slots(ids)
        weights = self._gather(slots, False)
        state = self._gather(slots, True) if self.optimizer.has_state else None
        return weights, state

    @torch.no_grad()
    def write_rows(
        self, ids: torch.Tensor, weights: torch.Tensor, state: torch.Tensor | None
    ) -> None:
        slots = self._slots(ids)
        self._scatter(slots, weights, False)
        if state is not None:
            self._scatter(slots, state, True)


class DeviceTier:
    """Rows in one dense [rows, dim] tensor and its optimizer state on a torch device.

    Slot i holds global row `slot_gid[i]`. `weight` and `update(rows, grad)` are what the fused
    lookup (`FusedLookup`) needs; `on_update`, when set, hears of every updated slot (a replica
    marks them dirty)."""

    name = "device"

    def __init__(
        self,
        slot_gid: torch.Tensor,
        dim: int,
        optimizer: SparseOptimizer,
        device: torch.device,
    ) -> None:
        n = slot_gid.numel()
        self.slot_gid = slot_gid.long()
        self.dim = dim
        self.optimizer = optimizer
        self.lr = optimizer.learning_rate
        self.device = device
        self.weight = torch.zeros(n, dim, dtype=torch.float32, device=device)
        self.state = optimizer.zero_state(n, dim, device=device)
        self.on_update: Callable[[torch.Tensor], None] | None = None
        self._placeholder = torch.zeros(0, device=device, requires_grad=True)

    @property
    def num_rows(self) -> int:
        return self.slot_gid.numel()

    def update(self, rows: torch.Tensor, grad: torch.Tensor) -> None:
        apply_sparse_update(self.weight, self.state, rows, grad, self.optimizer, self.lr)
        if self.on_update is not None:
            self.on_update(rows)

    def pool(self, slots: torch.Tensor, offsets: torch.Tensor, training: bool) -> torch.Tensor:
        """Sum-pooled bags [bags, dim] of slots; with `training` the backward updates the rows."""
        if training:
            return FusedLookup.apply(self._placeholder, self, slots, offsets)
        return F.embedding_bag(slots, self.weight, offsets[:-1], mode="sum")


class Replica:
    """A fast tier's copies of rows of a slower tier (FAE: the hot rows on the device, every row
    on the host), each side authoritative for the rows it last updated.

    Dirty bitmaps over the fast tier's slots record which side is newer; before a side is read,
    `pull()` / `push()` copies the other side's dirty rows (weights and optimizer state) in one
    vectorised gather and scatter, counting bytes on the link between the two tiers.
    """

    def __init__(self, fast: DeviceTier, slow: RowStore, stats: TransferStats) -> None:
        self.fast, self.slow, self.stats = fast, slow, stats
        self.row_bytes = row_bytes(fast.dim, fast.optimizer)
        n = fast.num_rows
        self.fast_dirty = torch.zeros(n, dtype=torch.bool, device=fast.device)  # newer on fast
        self.slow_dirty = torch.zeros(n, dtype=torch.bool)  # newer on slow
        self.fast_ahead = False
        self.slow_ahead = False
        fast.on_update = self.fast_updated

    def fast_updated(self, slots: torch.Tensor) -> None:
        self.fast_dirty.index_fill_(0, slots, True)
        self.fast_ahead = True

    def slow_updated(self, slots: torch.Tensor) -> None:
        """The slow tier is about to update (or updated) these fast slots' rows (CPU slots)."""
        if slots.numel():
            self.slow_dirty.index_fill_(0, slots, True)
            self.slow_ahead = True

    @torch.no_grad()
    def refresh(self) -> None:
        """Every row slow -> fast (after the slow tier's rows were written from outside)."""
        weights, state = self.slow.read_rows(self.fast.slot_gid)
        self.fast.weight.copy_(weights.to(self.fast.device))
        if self.fast.state is not None:
            self.fast.state.copy_(state.to(self.fast.device))
        self.fast_dirty.zero_()
        self.slow_dirty.zero_()
        self.fast_ahead = self.slow_ahead = False

    @torch.no_grad()
    def push(self) -> None:
        """The rows the fast tier updated since the last sync, fast -> slow."""
        t0 = time.perf_counter()
        slots = torch.nonzero(self.fast_dirty).squeeze(1)
        fast = self.fast
        state = None if fast.state is None else fast.state.index_select(0, slots).cpu()
        self.slow.write_rows(
            fast.slot_gid[slots.cpu()], fast.weight.index_select(0, slots).cpu(), state
        )
        self.fast_dirty.zero_()
        self.fast_ahead = False
        self._count(fast.name, self.slow.name, slots.numel(), t0)

    @torch.no_grad()
    def pull(self) -> None:
        """The rows the slow tier updated since the last sync, slow -> fast."""
        t0 = time.perf_counter()
        slots = torch.nonzero(self.slow_dirty).squeeze(1)
        fast = self.fast
        weights, state = self.slow.read_rows(fast.slot_gid[slots])
        on_fast = slots.to(fast.device)
        fast.weight.index_copy_(0, on_fast, weights.to(fast.device))
        if fast.state is not None:
            fast.state.index_copy_(0, on_fast, state.to(fast.device))
        self.slow_dirty.zero_()
        self.slow_ahead = False
        self._count(self.slow.name, fast.name, slots.numel(), t0)

    def sync(self) -> None:
        """Both sides current."""
        if self.fast_ahead:
            self.push()
        if self.slow_ahead:
            self.pull()

    def _count(self, src: str, dst: str, rows: int, t0: float) -> None:
        self.stats.add_bytes(src, dst, "sync", rows * self.row_bytes)
        self.stats.sync_rows += rows
        self.stats.syncs += 1
        self.stats.sync_s += time.perf_counter() - t0
