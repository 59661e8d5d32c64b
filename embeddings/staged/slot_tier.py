"""A staged collection's device tier (embeddings/staged/collection.py): hot rows and staging slots.

One table-batched collection (fbgemm's kernels on CPU, PyTorch's own ops where fbgemm has none:
embeddings/fused.py) whose table t holds table t's hot rows (in the order of their slots in the
`HotRowMap`) followed by `capacity[t]` staging slots, where a step's cold rows are loaded. Its
tables lie back to back in one buffer, so rows anywhere in it are one flat index (`weight`,
`state`): table t's rows start at `table_start[t]`.
"""

from __future__ import annotations

import torch

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError
from embeddings.fused import FusedEmbeddingBagCollection
from embeddings.hot_map import HotRowMap
from embeddings.row_layout import flat_rows, table_row_base


class SlotTier:
    """Hot rows and staging slots on `device`; `place(hot_gids)` makes it."""

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer,
        device: torch.device,
        backend: str,
        seed: int,
        staging_rows: int,
    ) -> None:
        """`staging_rows`: staging slots per table to make with the tier (e.g. the mini-batch
        size), so that the first mini-batches do not grow it: growing copies the whole tier (its
        bytes twice, for a moment)."""
        self.tables, self.optimizer, self.device = list(tables), optimizer, device
        self.backend_name, self.seed = backend, seed
        self.dim = tables[0].embedding_dim
        self.sizes = [t.num_embeddings for t in tables]
        self.row_base = table_row_base(self.sizes)
        self.total_rows = sum(self.sizes)
        self.lr = optimizer.learning_rate
        self._staging_rows = int(staging_rows)
        self.capacity = [0] * len(tables)  # staging slots per table

    @torch.no_grad()
    def place(
        self, hot_gids: torch.Tensor, values: tuple[torch.Tensor, torch.Tensor | None] | None = None
    ) -> None:
        """Hold rows `hot_gids` (sorted; `values`: their weights and state) and `capacity`
        staging slots per table; the map global row -> slot in its table."""
        self.hot_map = HotRowMap(hot_gids, self.row_base, self.total_rows)
        self.n_hot, self.hot_gids = self.hot_map.n_hot, hot_gids
        self.capacity = [
            max(c, min(self._staging_rows, s - int(h)))
            for c, s, h in zip(self.capacity, self.sizes, self.n_hot)
        ]  # fmt: skip
        self._build()
        if values is not None and hot_gids.numel():
            slots = self.hot_slots(hot_gids)
            self.weight.index_copy_(0, slots, values[0].to(self.device))
            if values[1] is not None:
                self.state.index_copy_(0, slots, values[1].to(self.device))

    def _build(self) -> None:
        """The collection: table t has `n_hot[t]` hot rows, then `capacity[t]` staging slots
        (optimizer state zero; rows left for the caller to fill)."""
        rows = [max(1, int(h) + c) for h, c in zip(self.n_hot, self.capacity)]
        specs = [TableSpec(t.name, r, self.dim, t.feature_name) for t, r in zip(self.tables, rows)]
        self.fast = FusedEmbeddingBagCollection(
            specs, self.optimizer, self.device, self.backend_name, self.seed, init=False
        )
        self.fast.set_learning_rate(self.lr)
        self.weight = flat_rows(self.fast.table_weights())
        states = self.fast.optimizer_states()
        self.state = None if states[0] is None else flat_rows(states)
        if self.weight is None or (states[0] is not None and self.state is None):
            raise PlacementError("the device tier's tables are not in one buffer")
        if self.state is not None:
            self.state.zero_()
        self.table_start = torch.zeros(len(rows), dtype=torch.int64)  # first flat row per table
        self.table_start[1:] = torch.cumsum(torch.tensor(rows[:-1]), 0)

    @torch.no_grad()
    def ensure_capacity(self, per_table: torch.Tensor, lookups_per_table: torch.Tensor) -> None:
        """Staging slots for `per_table` rows of each table. When a table is short of them, every
        table gets as many as the batch has lookups in it (`lookups_per_table`: the most cold
        rows it can have), and a short one at least twice as many as before; the tier is rebuilt
        with the hot rows copied over (nothing may be staged)."""
        need = per_table.tolist()
        if all(n <= c for n, c in zip(need, self.capacity)):
            return
        room = [s - int(h) for s, h in zip(self.sizes, self.n_hot)]
        self.capacity = [
            min(max(c, int(k), 2 * c if n > c else 0), r)
            for n, c, r, k in zip(need, self.capacity, room, lookups_per_table)
        ]  # fmt: skip
        old = self.fast
        self._build()
        pairs = [(old.table_weights(), self.fast.table_weights())]
        if self.state is not None:
            pairs.append((old.optimizer_states(), self.fast.optimizer_states()))
        for src, dst in pairs:
            for t, h in enumerate(self.n_hot.tolist()):
                dst[t][:h] = src[t][:h]

    def staging_slots(self, per_table: torch.Tensor) -> torch.Tensor:
        """The flat rows of sorted staged rows, `per_table[t]` of table t: after its hot rows,
        in order."""
        rows = int(per_table.sum())
        first = torch.cumsum(per_table, 0) - per_table
        shift = (self.table_start + self.n_hot - first).repeat_interleave(
            per_table, output_size=rows
        )
        return (torch.arange(rows) + shift).to(self.device)

    def hot_slots(self, gids: torch.Tensor) -> torch.Tensor:
        """The flat rows of hot rows `gids`."""
        table = torch.bucketize(gids, self.row_base, right=True) - 1
        return (self.table_start[table] + self.hot_map.slots(gids)).to(self.device)

    def hot_rows(self, t: int, state: bool = False) -> torch.Tensor:
        """Table t's hot rows (weights, or optimizer state), in slot order: a view."""
        start = int(self.table_start[t])
        return (self.state if state else self.weight)[start : start + int(self.n_hot[t])]

    def hot_and_cold(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Table t's hot rows (in slot order) and its other rows (ascending), as row ids."""
        hot = self.hot_map.table_hot(t)
        cold = torch.ones(self.sizes[t], dtype=torch.bool)
        cold[hot] = False
        return hot, torch.nonzero(cold).squeeze(1)

    def set_learning_rate(self, lr: float) -> None:
        self.lr = float(lr)
        self.fast.set_learning_rate(lr)

    @property
    def num_hot(self) -> int:
        return self.hot_gids.numel()

    @property
    def slots(self) -> int:
        """Rows the tier holds: hot rows and staging slots."""
        return self.num_hot + sum(self.capacity)
