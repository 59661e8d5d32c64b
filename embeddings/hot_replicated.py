"""Hot rows replicated on every rank, cold rows sharded: the hybrid placements (`--placement fae`
or `hotline`) with several processes.

Each table is cut in two by the placement plan's hot set (the rows a single process would keep
on its device):

- a hot part, the plan's hot rows in slot order: a DATA-PARALLEL table (every rank holds all of
  it; its gradient is all-reduced and the fused optimizer's rule applied to it, as
  embeddings/sharded.py does for data-parallel tables);
- a cold part, every other row in row order: sharded by torchrec's planner (`--sharding`).

A lookup goes to the part its row lives in (the plan's id map, one gather); with sum pooling a
bag's pooled embedding is the hot part's pooled sum plus the cold part's, so the collection
computes what one table computes, to float rounding. Lookups of hot rows never cross ranks: the
ids all-to-all carries only the cold ids, and a table whose rows are all hot has no pooled
all-to-all at all. The price: the hot part's gradient all-reduce is dense, every hot row's
gradient every step whether the batch touched it or not (torchrec's data-parallel tables are
dense modules under DDP), so it pays when the hot set is small and the lookups are skewed
(docs/distributed.md has the bytes).

This is not FAE's or Hotline's single-process schedule: the batches are trained in the order
they come, every batch through both parts, exactly what `--placement device` trains in one
process. What carries over is the plan: the hot set under `--hot-budget` (per rank, weights and
optimizer state).
"""

from __future__ import annotations

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embeddings.collection import EmbeddingCollection
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.fused import uniform_table
from embeddings.kjt_ops import in_feature_order
from embeddings.sharded import FullTableLoads, LocalShard, ShardedEmbeddingBagCollection
from embeddings.transfer_stats import no_transfer_counters


class HotReplicatedCollection(FullTableLoads, EmbeddingCollection):
    """Per table a replicated hot part and a sharded cold part (see the module docstring)."""

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer,
        hot_rows: list[np.ndarray],
        device: torch.device | str = "cpu",
        sharding: str = "auto",
        seed: int = 0,
        min_column_shard: int | None = None,
    ) -> None:
        """`hot_rows[t]`: table t's hot rows (row ids), in the order of the hot part's rows."""
        super().__init__()
        self.tables = list(tables)
        self.feature_names = [t.feature_name for t in tables]
        self.dims = [t.embedding_dim for t in tables]
        self.optimizer = optimizer
        self.device = torch.device(device)
        sizes = [t.num_embeddings for t in tables]
        self.hot_ids, self.cold_ids = [], []
        slot = torch.empty(sum(sizes), dtype=torch.int64)
        is_hot = torch.zeros(sum(sizes), dtype=torch.bool)
        base = 0
        for t, rows in zip(self.tables, hot_rows):
            hot = torch.as_tensor(np.asarray(rows, dtype=np.int64))
            mask = torch.zeros(t.num_embeddings, dtype=torch.bool)
            mask[hot] = True
            if int(mask.sum()) != hot.numel():
                raise ValueError(f"table {t.name}: hot rows repeated or out of range")
            cold = torch.nonzero(~mask).flatten()
            slot[base + hot] = torch.arange(hot.numel())
            slot[base + cold] = torch.arange(cold.numel())
            is_hot[base + hot] = True
            self.hot_ids.append(hot)
            self.cold_ids.append(cold)
            base += t.num_embeddings
        self._slot, self._is_hot = slot.to(self.device), is_hot.to(self.device)
        self._base = torch.tensor([0, *np.cumsum(sizes)[:-1].tolist()], device=self.device)
        self._sizes = torch.tensor(sizes, device=self.device)
        # the parts: tables (of the same features) holding some rows each, and which full table
        # each sub-table is
        self.hot_tables = [i for i, h in enumerate(self.hot_ids) if h.numel()]
        self.cold_tables = [i for i, c in enumerate(self.cold_ids) if c.numel()]
        hot = cold = None
        if self.hot_tables:
            specs = [self._sub(i, "hot", self.hot_ids[i].numel()) for i in self.hot_tables]
            hot = ShardedEmbeddingBagCollection(specs, optimizer, device, "data_parallel", seed)
        if self.cold_tables:
            specs = [self._sub(i, "cold", self.cold_ids[i].numel()) for i in self.cold_tables]
            cold = ShardedEmbeddingBagCollection(
                specs, optimizer, device, sharding, seed, min_column_shard
            )
        # not submodules: the state dict is this collection's full tables, not the parts'
        object.__setattr__(self, "hot", hot)
        object.__setattr__(self, "cold", cold)
        kinds = sorted(self.cold.sharding_kinds()) if self.cold is not None else []
        self.backend = f"hot-replicated(hot=data_parallel, cold={'+'.join(kinds) or 'none'})"
        self._init_tables(seed)

    def _sub(self, i: int, part: str, rows: int) -> TableSpec:
        t = self.tables[i]
        return TableSpec(f"{t.name}_{part}", rows, t.embedding_dim, t.feature_name)

    def _parts(self):
        """(part, its full-table indices, per full table the rows it holds) for each part."""
        if self.hot is not None:
            yield self.hot, self.hot_tables, self.hot_ids
        if self.cold is not None:
            yield self.cold, self.cold_tables, self.cold_ids

    def _init_tables(self, seed: int) -> None:
        """Every row starts at the single-process value (`uniform_table` of its full table)."""
        full = {
            i: uniform_table(t.num_embeddings, t.embedding_dim, i, seed)
            for i, t in enumerate(self.tables)
        }
        self.copy_in(full, "weight")

    def copy_in(self, full: dict[int, torch.Tensor], which: str) -> None:
        for part, indices, ids in self._parts():
            part.copy_in({j: full[i][ids[i]] for j, i in enumerate(indices)}, which)

    # --- lookups -----------------------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        kjt = in_feature_order(features, self.feature_names)
        T, B = len(self.tables), kjt.stride()
        lengths = kjt.lengths()
        values = kjt.values().long()
        table = torch.repeat_interleave(
            torch.arange(T, device=values.device), lengths.view(T, B).sum(1)
        )
        if values.numel() and bool(((values < 0) | (values >= self._sizes[table])).any()):
            bad = int(torch.nonzero((values < 0) | (values >= self._sizes[table]))[0])
            raise IndexError(f"row {int(values[bad])} of table {self.tables[int(table[bad])].name}")
        gid = values + self._base[table]
        hot, slots = self._is_hot[gid], self._slot[gid]
        bag = torch.repeat_interleave(torch.arange(T * B, device=values.device), lengths.long())
        hot_len = torch.bincount(bag[hot], minlength=T * B).view(T, B)
        cold_len = lengths.view(T, B).long() - hot_len
        pooled: dict[str, torch.Tensor] = {}
        for part, indices, (mask, part_len) in (
            (self.hot, self.hot_tables, (hot, hot_len)),
            (self.cold, self.cold_tables, (~hot, cold_len)),
        ):
            if part is None:
                continue
            sub = KeyedJaggedTensor(
                keys=[self.feature_names[i] for i in indices],
                values=slots[mask].to(kjt.values().dtype),
                lengths=part_len[indices].reshape(-1).to(lengths.dtype),
                stride=B,
            )  # fmt: skip
            for f, v in part(sub).to_dict().items():
                pooled[f] = pooled[f] + v if f in pooled else v
        values_out = torch.cat([pooled[f] for f in self.feature_names], dim=1)
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=values_out)

    def set_learning_rate(self, lr: float) -> None:
        for part, _, _ in self._parts():
            part.set_learning_rate(lr)

    # --- full tables (collectives: every rank calls them) ---------------------------------------

    def _gathered(self, which: str) -> list[torch.Tensor | None]:
        if which == "state" and not self.optimizer.has_state:
            return [None] * len(self.tables)
        out: list[torch.Tensor] = []
        for t in self.tables:
            n, dim = t.num_embeddings, t.embedding_dim
            if which == "state":
                out.append(self.optimizer.zero_state(n, dim, device=self.device))
            else:
                out.append(torch.zeros(n, dim, device=self.device))
        for part, indices, ids in self._parts():
            got = part.table_weights() if which == "weight" else part.optimizer_states()
            for j, i in enumerate(indices):
                out[i][ids[i]] = got[j]
        return out

    def table_weights(self) -> list[torch.Tensor]:
        """Every table whole on every rank (copies; a collective)."""
        return self._gathered("weight")  # type: ignore[return-value]

    def optimizer_states(self) -> list[torch.Tensor | None]:
        return self._gathered("state")

    def local_shards(self) -> list[LocalShard]:
        """This rank's shards in full-table coordinates: `rows` names each shard row's row."""
        out = []
        for part, indices, ids in self._parts():
            for s in part.local_shards():
                i = indices[s.table]
                rows = ids[i][s.row0 : s.row0 + s.weight.shape[0]]
                out.append(LocalShard(i, 0, s.col0, s.weight, s.state, s.replicated, rows))
        return out

    # --- reports ------------------------------------------------------------------------------

    def plan_table(self) -> list[dict]:
        """Per part and table: rows, sharding and shards (the parts' torchrec plans)."""
        out = []
        for name, part in (("hot", self.hot), ("cold", self.cold)):
            for entry in part.plan_table() if part is not None else []:
                out.append({"part": name, **entry})
        return out

    def plan_text(self) -> str:
        return "\n".join(
            f"{name} part:\n{part.plan_text()}"
            for name, part in (("hot", self.hot), ("cold", self.cold))
            if part is not None
        )

    def counters(self) -> dict:
        return no_transfer_counters()

    def placement_info(self) -> dict:
        hot = sum(h.numel() for h in self.hot_ids)
        return {
            "kind": "hot_replicated", "backend": self.backend, "hot_rows": hot,
            "hot_bytes_per_rank": sum(
                h.numel() * (d + self.optimizer.state_floats(d)) * 4
                for h, d in zip(self.hot_ids, self.dims)
            ),
            "tables_all_hot": len(self.hot_tables) - len(set(self.hot_tables) & set(self.cold_tables)),
            "world_size": (self.hot or self.cold).world_size,
        }  # fmt: skip

    def replicated_across_ranks(self) -> bool:
        return True
