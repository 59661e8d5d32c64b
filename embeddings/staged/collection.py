"""Hot rows on the device, cold rows staged per mini-batch from an injected row store, behind the
embedding-collection contract: Hotline (Adnan et al., ISCA 2024) with the host tier as the store
(embeddings/staged/hotline.py), `--placement tiered` with the SSD tier (embeddings/ssd/collection.py).

One home per row:
- the device tier holds the plan's hot rows, weights and optimizer state;
- the row store (a `RowStore`, embeddings/row_store.py: rows and state read and written back by
  global id) holds every other row, and is its only copy.
No row is kept in two tiers, so nothing is synced in bulk.

The device tier is one table-batched collection (fbgemm's kernels on CPU, PyTorch's own ops where
fbgemm has none: embeddings/fused.py). Its table t holds the hot rows of table t followed by
*staging slots*. A training step's cold rows are staged (the contract of embeddings/staged/contract.py):
deduplicated and read from the store with their optimizer state (`stage`, which also classifies
the inputs: popular when every lookup is hot, and maps every lookup to its row in the device tier;
the staging train pipeline runs it mini-batches ahead, on a worker), then copied into the staging
slots (`using`). The step itself is the device placement's: one lookup over hot and staged rows
with the optimizer fused into backward, so every row, hot or cold, gets one update per step from
its summed gradient.

Staged rows go home (written back to the store, weights and state) when the slots are loaded
again, or before anything reads the store's rows (`sync`). A staging read from the store before a
write-back of some of its rows is refreshed when it is loaded: it is never used stale.

Evaluation stages its batch's cold rows itself. With `plan=None` every row starts in the store;
`observe` counts accesses and `adopt(plan)` moves the plan's hot rows to the device (Hotline's
online popularity; the store must be able to `keep_only` the rest).

Hot rows start from the store's initial values (`RowStore.init_rows`). A store with files of its
own (the SSD tier) is not copied into checkpoints: during one the state dict holds the hot rows and
the point of the store's files `begin_checkpoint` marked; outside a checkpoint it is the contract's
full tables (exports, tests).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embeddings.collection import EmbeddingCollection
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError, TierError
from embeddings.kjt_ops import in_feature_order
from embeddings.plan import EXPLICIT, REST, PlacementPlan, TierPlan, row_bytes
from embeddings.row_layout import table_row_base
from embeddings.row_store import RowStore
from embeddings.staged.checkpoint import holds_point, read_point, restore_point, save_point
from embeddings.staged.lookup_map import RowOutOfRange, map_lookups
from embeddings.staged.rows import StagedRows, members
from embeddings.staged.slot_tier import SlotTier
from embeddings.staged.tables import assemble, rows_of, store_tables
from embeddings.transfer_stats import TransferStats

# write-backs remembered for refreshing stagings; a staging older than this is read again whole
WRITEBACK_LOG = 16


def one_home(plan: PlacementPlan, store: str) -> PlacementPlan:
    """`plan` with every row in one home: the device tier's listed rows, and the store `store`
    (its tier name) holding the rest. A plan's slower tier is the planner's "host" (every row
    for FAE's replica, or the rest) or already the store's."""
    names = plan.tier_names
    if len(names) != 2 or names[0] != "device" or names[1] not in ("host", store):
        raise PlacementError(
            f"placement plan: staging from the {store} tier needs a device tier and a host or "
            f"{store} tier, not {names}"
        )
    device, cold = plan.tiers
    if device.rows != EXPLICIT:
        raise PlacementError("placement plan: the device tier must list its rows")
    if names[1] == store and cold.rows == REST and not plan.replicated:
        return plan
    tiers = [device, TierPlan(store, REST, None, cold.budget if names[1] == store else None)]
    return PlacementPlan(
        plan.feature_names, plan.table_sizes, plan.dims, plan.optimizer, tiers, False,
        dict(plan.report),
    )  # fmt: skip


class StagedEmbeddingBagCollection(EmbeddingCollection):
    """Hot rows on the device, every other row only in `store`, cold rows staged per step."""

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer,
        plan: PlacementPlan | None,
        store: RowStore,
        device: torch.device | str | None = None,
        backend: str = "auto",
        seed: int = 0,
        staging_rows: int = 0,
        kind: str = "hotline",
    ) -> None:
        """`plan`: the hot rows (None: learned later, `adopt`); `store`: the home of every other
        row (of every row while `plan` is None), holding exactly those. `staging_rows`: staging
        slots per table to make with the device tier (e.g. the mini-batch size), so that the
        first mini-batches do not grow it: growing copies the whole tier (its bytes twice, for a
        moment). `kind`: the placement's name in summaries and messages."""
        super().__init__()
        self.kind = kind
        self.tables = list(tables)
        self.feature_names = [t.feature_name for t in tables]
        self.dims = [t.embedding_dim for t in tables]
        if len(set(self.dims)) != 1:
            raise ValueError(f"{kind} placement: every embedding table must have the same width")
        self.dim = self.dims[0]
        self.optimizer = optimizer
        self.device = torch.device(device or "cpu")
        self.sizes = [t.num_embeddings for t in tables]
        self.row_base = table_row_base(self.sizes)
        self._np_sizes, self._np_row_base = np.array(self.sizes), self.row_base.numpy()
        self.total_rows = sum(self.sizes)
        self.stats = TransferStats()
        self._row_bytes = row_bytes(self.dim, optimizer)
        self._side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._staged: StagedRows | None = None
        self._in_slots: tuple[torch.Tensor, torch.Tensor, bool] | None = None  # gids, slots, dirty
        self.version = 0  # write-backs so far
        self._writebacks: deque[tuple[int, torch.Tensor]] = deque(maxlen=WRITEBACK_LOG)
        self._export: dict[str, list[torch.Tensor]] = {}
        self._store_checkpoint = False  # a checkpoint holds a point of the store's files now
        self._restored = False  # the store's files were rolled back to a checkpoint's point
        self.learn_counts: torch.Tensor | None = None  # accesses per global row while learning
        self.learned_batches = 0
        self.plan: PlacementPlan | None = None
        self.store = store
        self.device_tier = SlotTier(
            self.tables, optimizer, self.device, backend, seed, staging_rows
        )
        if plan is None:
            self.device_tier.place(torch.zeros(0, dtype=torch.int64))
        else:
            plan = self._one_home(plan)
            self.device_tier.place(self._hot_gids(plan))
            self._init_hot_rows()
            self.plan = plan

    @property
    def backend(self) -> str:
        return f"{self.kind}({self.store.name}={self.store.backend}, device={self.fast.backend})"

    # --- tiers ------------------------------------------------------------------------------------

    def _one_home(self, plan: PlacementPlan) -> PlacementPlan:
        plan.check_fits(
            self.feature_names, self.sizes, self.dims, self.optimizer.kind, "placement plan"
        )
        return one_home(plan, self.store.name)

    def _hot_gids(self, plan: PlacementPlan) -> torch.Tensor:
        """The plan's hot rows as sorted global ids."""
        hot_t, hot_r = plan.hot_ids()
        return torch.sort(torch.from_numpy(hot_r) + self.row_base[torch.from_numpy(hot_t)])[0]

    @torch.no_grad()
    def _init_hot_rows(self) -> None:
        """The hot rows' initial values, the store's, written into the device tier."""
        for t in range(len(self.tables)):
            rows = self.hot_map.table_hot(t)  # in slot order
            self.store.init_rows(t, rows, self.device_tier.hot_rows(t))

    # the device tier's parts that tests, benchmarks and summaries look at
    fast = property(lambda self: self.device_tier.fast)
    hot_map = property(lambda self: self.device_tier.hot_map)
    hot_gids = property(lambda self: self.device_tier.hot_gids)
    n_hot = property(lambda self: self.device_tier.n_hot)
    capacity = property(lambda self: self.device_tier.capacity)
    num_hot = property(lambda self: self.device_tier.num_hot)

    # --- staging --------------------------------------------------------------------------------

    def global_ids(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """Each lookup's global row id (CPU int64), table-major in feature order."""
        features = in_feature_order(features, self.feature_names)
        values = features.values().cpu().long()
        per_table = features.lengths().cpu().long().view(len(self.tables), -1).sum(1)
        return values + self.row_base.repeat_interleave(per_table, output_size=values.numel())

    @torch.no_grad()
    def stage(
        self, features: KeyedJaggedTensor, inputs: int | None = None, version: int | None = None
    ) -> StagedRows:
        """Read these lookups' cold rows (unique) with their state from the store, onto the
        device, and map every lookup to its row in the device tier. Thread-safe: it only reads
        (the store must have been written back by the caller: `version`, the write-backs it
        had received when the caller decided to stage, default now, tells `using` what to
        refresh). `inputs`: the mini-batch's inputs (labels), to count the popular ones; an
        input is its label's KJT rows (one for DLRM, ts_length + 1 for TBSM)."""
        version = self.version if version is None else version
        t0 = time.perf_counter()
        features = in_feature_order(features, self.feature_names)
        lengths = features.lengths().cpu().numpy()
        try:
            m = map_lookups(
                features.values().cpu().numpy(), lengths, features.stride(), self._np_sizes,
                self._np_row_base, self.hot_map,
            )  # fmt: skip
        except RowOutOfRange as e:
            t = self.tables[e.table]
            raise TierError(
                f"{self.kind}: row {e.row} is outside table {t.name} ({t.num_embeddings} rows)"
            ) from None
        popular = int(torch.from_numpy(m.popular).view(inputs, -1).all(1).sum()) if inputs else 0
        gids, per_table = torch.from_numpy(m.cold_gids), torch.from_numpy(m.per_table)
        slot = torch.from_numpy(m.slots)
        per_table_lookups = torch.from_numpy(lengths).long().view(len(self.tables), -1).sum(1)
        if gids.numel():
            weight, state = self.store.read_rows(gids)
        else:
            weight = torch.zeros(0, self.dim)
            state = (
                None
                if self.device_tier.state is None
                else torch.zeros((0, *self.device_tier.state.shape[1:]))
            )
        ready = None
        if self._side is not None:  # pinned host memory, copied on a side stream
            with torch.cuda.stream(self._side):
                weight, slot = (
                    x.pin_memory().to(self.device, non_blocking=True) for x in (weight, slot)
                )
                if state is not None:
                    state = state.pin_memory().to(self.device, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(self._side)
        return StagedRows(
            gids, weight, state, per_table, per_table_lookups, slot, slot.numel(), popular, version,
            time.perf_counter() - t0, ready,
        )  # fmt: skip

    def renewal(self, since: int) -> Callable[[StagedRows], None] | None:
        """On the step's thread, just after a write-back: what renews a staging made at version
        `since` (its read began then) up to now, for the staging worker to run before the step
        uses it (None: nothing to renew). It reads from the store the rows written back since
        (their newest values are home now), so the step's own `using` only copies the rows of
        the write-back that follows, still in the staging slots. The write-backs are taken
        now, on this thread: the worker never looks at the log the step thread appends to."""
        version = self.version
        if since >= version:
            return None
        complete = bool(self._writebacks) and since + 1 >= self._writebacks[0][0]
        log = [g for v, g in self._writebacks if since < v] if complete else None
        # the rows in the slots now go home next, before the staging is loaded: the worker also
        # finds which staged rows they are, which `using` then copies from the slots
        upcoming = self._in_slots[0] if self._in_slots is not None else None

        def renew(staged: StagedRows) -> None:
            self._renew_from_store(staged, version, log)
            if upcoming is not None and upcoming.numel() and staged.rows:
                at = torch.searchsorted(upcoming, staged.gids).clamp(max=upcoming.numel() - 1)
                dst = torch.nonzero(upcoming[at] == staged.gids).squeeze(1)
                staged.overlap = (upcoming, dst, at[dst])

        return renew

    @torch.no_grad()
    def _renew_from_store(
        self, staged: StagedRows, version: int, log: list[torch.Tensor] | None
    ) -> None:
        """(The staging worker) `staged`'s rows among the write-backs `log` (None: the log did
        not reach back to the staging: every row) read again from the store; the staging is
        then as if read at `version`."""
        if staged.version >= version or not staged.rows:
            return
        if log is None:
            pos = torch.arange(staged.rows)
        else:
            hit = torch.zeros(staged.rows, dtype=torch.bool)
            for g in log:
                hit |= members(staged.gids, g)
            pos = torch.nonzero(hit).squeeze(1)
        if pos.numel():
            weight, state = self.store.read_rows(staged.gids[pos])
            if self._side is None:
                staged.weight[pos] = weight
                if state is not None:
                    staged.state[pos] = state
            else:  # after the staging's own copies, on the same side stream
                with torch.cuda.stream(self._side):
                    on_dev = pos.to(self.device, non_blocking=True)
                    staged.weight[on_dev] = weight.to(self.device)
                    if state is not None:
                        staged.state[on_dev] = state.to(self.device)
                    staged.ready = torch.cuda.Event()
                    staged.ready.record(self._side)
            staged.renewed += pos.numel()
        staged.version = version

    def _refresh(self, staged: StagedRows, prev: tuple[torch.Tensor, torch.Tensor] | None) -> int:
        with self.store.step_io():
            return self._renew(staged, prev)

    @torch.no_grad()
    def _renew(self, staged: StagedRows, prev: tuple[torch.Tensor, torch.Tensor] | None) -> int:
        """Renew the staged rows the store received back since the staging's read began (a
        prefetched row an earlier step updated); returns how many. Rows of the step just written
        back (`prev`: their gids and staging slots, still holding them) are copied on the device;
        older ones are read from the store again."""
        if staged.version == self.version or not staged.rows:
            staged.version = self.version
            return 0
        newest = self.version if prev is None else self.version - 1  # older write-backs
        from_device = torch.zeros(staged.rows, dtype=torch.bool)
        if prev is not None and prev[0].numel():  # the newest copies of all: still in the slots
            if staged.overlap is not None and staged.overlap[0] is prev[0]:  # found by the worker
                dst, at = staged.overlap[1], staged.overlap[2]
                from_device[dst] = True
            else:
                at = torch.searchsorted(prev[0], staged.gids).clamp(max=prev[0].numel() - 1)
                from_device = prev[0][at] == staged.gids
                dst = torch.nonzero(from_device).squeeze(1)
                at = at[dst]
            src = prev[1][at.to(self.device)]
            dst = dst.to(self.device)
            staged.weight[dst] = self.device_tier.weight[src]
            if self.device_tier.state is not None:
                staged.state[dst] = self.device_tier.state[src]
        oldest = self._writebacks[0][0] if self._writebacks else self.version + 1
        if staged.version + 1 < oldest:  # older than the log: every row again
            from_host = ~from_device
        else:
            from_host = torch.zeros(staged.rows, dtype=torch.bool)
            for v, g in self._writebacks:
                if staged.version < v <= newest:
                    from_host |= members(staged.gids, g)
            from_host &= ~from_device
        pos = torch.nonzero(from_host).squeeze(1)
        if pos.numel():
            weight, state = self.store.read_rows(staged.gids[pos])
            on_dev = pos.to(self.device)
            staged.weight[on_dev] = weight.to(self.device)
            if state is not None:
                staged.state[on_dev] = state.to(self.device)
            self.stats.add_bytes("host", "device", "gather", pos.numel() * self._row_bytes)
        staged.version = self.version
        return int(from_device.sum()) + pos.numel()

    @torch.no_grad()
    def _load(self, staged: StagedRows, training: bool) -> int:
        """The previous staged rows home, these into the staging slots; returns rows refreshed."""
        prev, version = self._in_slots, self.version
        self._write_back()
        # the rows written back just now, still in their slots: None when nothing was (a
        # mini-batch without cold rows, or not trained), so the newest write-back in the log is
        # an older step's and is renewed from the store
        prev = prev[:2] if prev is not None and self.version != version else None
        if staged.ready is not None:  # made on the side stream, used on this one
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(staged.ready)
            for x in (staged.weight, staged.state, staged.indices):
                if x is not None:
                    x.record_stream(stream)
            staged.ready = None
        refreshed = self._refresh(staged, prev)
        if staged.renewed:  # renewed on the worker: its bytes are counted here, on one thread
            self.stats.add_bytes("host", "device", "gather", staged.renewed * self._row_bytes)
            refreshed += staged.renewed
            staged.renewed = 0
        tier = self.device_tier
        tier.ensure_capacity(staged.per_table, staged.lookups_per_table)
        slots = tier.staging_slots(staged.per_table)
        tier.weight.index_copy_(0, slots, staged.weight)
        if tier.state is not None:
            tier.state.index_copy_(0, slots, staged.state)
        self._in_slots = (staged.gids, slots, training)
        if training:
            self.stats.add_bytes("host", "device", "gather", staged.rows * self._row_bytes)
            self.stats.cold_rows += staged.rows
        return refreshed

    def _write_back(self) -> None:
        with self.store.step_io():
            self._send_home()

    @torch.no_grad()
    def _send_home(self) -> None:
        """The rows in the staging slots, updated by a training step, home to the store."""
        if self._in_slots is None:
            return
        gids, slots, dirty = self._in_slots
        self._in_slots = None
        if not dirty or not gids.numel():
            return
        # one copy of the updated rows (a CPU device tier's index_select is already the host
        # copy), given up to the store, which may keep them as they are and store them later
        # on another thread (the SSD tier: its next holder, the staging worker)
        state = (
            None
            if self.device_tier.state is None
            else self.device_tier.state.index_select(0, slots).cpu()
        )
        self.store.give_rows(gids, self.device_tier.weight.index_select(0, slots).cpu(), state)
        self.stats.add_bytes("device", "host", "writeback", gids.numel() * self._row_bytes)
        self.version += 1
        self._writebacks.append((self.version, gids))

    def sync(self) -> None:
        self._write_back()

    @contextmanager
    def using(self, staged: StagedRows, waited_s: float | None = None):
        """A training step on the mini-batch `staged` was made for: its cold rows in the staging
        slots (refreshed first), its lookups already mapped. Yields the rows refreshed. With
        `waited_s` (how long the step waited for the staging) the step is counted when it ends
        (`count_step`)."""
        refreshed = self._load(staged, training=True)
        self._staged = staged
        try:
            yield refreshed
        finally:
            self._staged = None
        if waited_s is not None:
            self.count_step(staged, waited_s)

    # --- lookups --------------------------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        features = in_feature_order(features, self.feature_names)
        training = self.training and torch.is_grad_enabled()
        if training and self._store_checkpoint:  # a checkpoint left unfinished is over
            self._store_checkpoint = False
            self.store.end_checkpoint(False)
        staged = self._staged
        if staged is None:  # not prepared by a train pipeline: stage now, on the step's path
            self._write_back()
            staged = self.stage(features, version=self.version)
            self._load(staged, training)
        elif staged.lookups != features.values().numel():
            raise TierError(f"{self.kind}: the staged rows were prepared for another mini-batch")
        if training:
            self._export.clear()  # exported tables are stale from now on
            self.stats.train_inputs += features.stride()
        offsets = features.offsets().to(self.device).long()
        pooled = self.fast.pooled(staged.indices, offsets)
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=pooled)

    def set_learning_rate(self, lr: float) -> None:
        self.device_tier.set_learning_rate(lr)

    def count_step(self, staged: StagedRows, waited_s: float) -> None:
        """One mini-batch run with `staged`: its popular inputs, the staging's time and
        how long the step waited for it (its bytes are counted when loaded)."""
        s = self.stats
        s.hotline_batches += 1
        s.popular_inputs += staged.popular_inputs
        s.gather_s += staged.seconds
        s.exposed_gather_s += waited_s

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
        """Move the plan's hot rows (weights and state) to the device tier, the store keeping
        the rest (`RowStore.keep_only`)."""
        if self.plan is not None:
            raise PlacementError(f"{self.kind}: a plan was already adopted")
        plan = self._one_home(plan)
        self.sync()
        gids = self._hot_gids(plan)
        hot_values = self.store.read_rows(gids)
        self.store = self.store.keep_only(plan.tier_remaps(self.store.name))
        self.device_tier.place(gids, hot_values)
        self.stats.add_bytes("host", "device", "sync", gids.numel() * self._row_bytes)
        self.plan = plan
        self.learn_counts = None
        self._export.clear()
        self._writebacks.clear()
        self.version += 1  # every staging from before is stale

    # --- full tables, assembled from both tiers ---------------------------------------------------

    def table_weights(self) -> list[torch.Tensor]:
        """Copies of the full tables (rows come from two tiers): after writing into them call
        `after_tables_written()`, which stores them back."""
        self.sync()
        self._export["weight"] = assemble(self.device_tier, self.store, False)
        return self._export["weight"]

    def optimizer_states(self) -> list[torch.Tensor | None]:
        if self.device_tier.state is None:
            return [None] * len(self.tables)
        self.sync()
        self._export["state"] = assemble(self.device_tier, self.store, True)
        return self._export["state"]

    @torch.no_grad()
    def after_tables_written(self) -> None:
        weights, states = self._export.get("weight"), self._export.get("state")
        if weights is not None or states is not None:
            self._write_back()
            store_tables(self.device_tier, self.store, weights, states)
        self._export.clear()
        self.version += 1  # stagings of the old values are stale
        self._writebacks.clear()

    def rows_of(
        self, tables: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hot rows from the device tier, the others from the store (not the whole tables)."""
        self.sync()
        return rows_of(self.device_tier, self.store, tables, rows)

    # --- checkpoints: a store with files of its own keeps its rows there --------------------------

    def begin_checkpoint(self) -> None:
        self.sync()
        self._store_checkpoint = self.store.begin_checkpoint()

    def end_checkpoint(self, written: bool) -> None:
        if self._store_checkpoint:
            self._store_checkpoint = False
            self.store.end_checkpoint(written)

    def checkpoint_bytes(self) -> int:
        if self.store.own_files:
            return self.num_hot * self._row_bytes
        return super().checkpoint_bytes()

    def sparse_state_dict(self) -> dict[str, torch.Tensor]:
        if self._store_checkpoint:
            return {}  # in the hot rows and the store's files
        return super().sparse_state_dict()

    def load_sparse_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state and self._restored:
            return
        super().load_sparse_state_dict(state)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self._store_checkpoint:
            save_point(self.device_tier, self.store, destination, prefix)
        else:
            super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        if not holds_point(self.store, state_dict, prefix):  # full tables
            super()._load_from_state_dict(
                state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
            )  # fmt: skip
            return
        values = read_point(
            self.device_tier,
            self.store,
            state_dict,
            prefix,
            missing_keys,
            unexpected_keys,
            error_msgs,
        )
        if values is None:
            return
        self._write_back()
        restore_point(self.device_tier, self.store, values)
        self._in_slots = None
        self._export.clear()
        self.version += 1
        self._writebacks.clear()
        self._restored = True

    # --- counters and summaries -------------------------------------------------------------------

    def counters(self) -> dict:
        out = self.stats.as_dict()
        out.update(self.store.counters(out))
        return out

    def logged_counters(self) -> tuple[str, ...]:
        return (*super().logged_counters(), *self.store.logged_counters())

    def summary_parts(self) -> dict[str, dict]:
        return self.store.summary_parts(self.store.counters(self.stats.as_dict()))

    def placement_info(self) -> dict:
        info = {
            "kind": self.kind,
            "backend": self.backend,
            "hot_rows": self.num_hot,
            "staging_slots": sum(self.capacity),
            "device_tier_bytes": self.device_tier.slots * self._row_bytes,
            **self.store.placement_info(self.total_rows - self.num_hot, self._row_bytes),
            "learned_batches": self.learned_batches,
        }
        if self.plan is not None:
            info["device_budget"] = self.plan.device_budget
            info["plan_source"] = self.plan.report.get("source")
            info["plan_hot_input_share_sample"] = self.plan.report.get("hot_input_share")
            info["plan_hot_lookup_share_sample"] = self.plan.report.get("hot_lookup_share")
            if "offline_overlap" in self.plan.report:  # learned online, compared with a profile's
                info["hot_set_overlap_with_offline"] = self.plan.report["offline_overlap"]
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
                f"{self.kind} embeddings: unexpected checkpoint state {', '.join(unknown[:3])}"
            )
        if "placement_stats" in state:
            self.stats.load_state_tensor(state["placement_stats"])
        if "learn_counts" in state and self.plan is None:
            counts = state["learn_counts"]
            if counts.numel() != self.total_rows:
                raise ValueError(
                    f"{self.kind} learned counts: {counts.numel()} rows, expected {self.total_rows}"
                )
            self.learn_counts = counts.to(torch.int32).clone()
            self.learned_batches = int(state["learned_batches"])
