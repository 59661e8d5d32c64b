"""Tables sharded across the ranks of a process group by torchrec (planner + DistributedModelParallel).

This is the collection of multi-process training. Every rank holds one of these; together they
hold each table once (table-wise, column-wise, row-wise shards) or once per rank (data-parallel),
and together they compute exactly what one `FusedEmbeddingBagCollection` computes over the
global batch:

- the planner (`EmbeddingShardingPlanner`) is restricted by `ParameterConstraints` to the kinds
  asked for; `collective_plan` makes rank 0's plan everyone's;
- sharded tables use torchrec's FUSED kernel (fbgemm's table-batched embedding with the sparse
  optimizer in backward: the same EXACT_SGD / EXACT_ADAGRAD / EXACT_ROWWISE_ADAGRAD as the
  single-process collection). torchrec divides the gradients its backward all-to-all returns
  by the world size (`comm_ops.get_gradient_division`), so a rank's mean loss over its slice of
  the batch gives each row the gradient of the global batch's mean loss;
- data-parallel tables use the DENSE kernel under torchrec's DDP; the same update rule
  (`apply_rule`) runs inside backward on each all-reduced (averaged) gradient bucket, as a DDP
  communication hook (so the trainer still steps only the dense optimizer);
- every table starts from `uniform_table(rows, dim, i, seed)`, the single-process values.

Column-wise shards with row-wise Adagrad are refused: each column shard would keep its own
row-wise state over its columns only, which is not the single-process update.

Export (`table_weights`, `optimizer_states`, `state_dict`) is a collective: every rank must call
it, and each gets the full tables (an all-reduce of disjoint shards). Sharded checkpoints use
`local_shards()` instead (dlrm/checkpoints/sharded.py), which communicates nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embeddings.collection import EmbeddingCollection
from embeddings.config import TableSpec
from embeddings.fused import uniform_table
from embeddings.optimizer import SparseOptimizer
from embeddings.transfer_stats import no_transfer_counters

log = logging.getLogger(__name__)

SHARDINGS = ("auto", "table_wise", "column_wise", "row_wise", "data_parallel")
# what gloo's collectives can run: row-wise shards reduce-scatter their pooled outputs
GLOO_SHARDINGS = ("table_wise", "column_wise", "data_parallel")


class ShardingError(ValueError):
    """A sharding that cannot run here (the message names the flag's value and why)."""


@dataclass
class LocalShard:
    """One shard this rank holds: rows [row0, row0 + rows) and columns [col0, col0 + cols) of
    table `table`; `weight` and `state` are views of the live storage (`state` as the optimizer
    stores it, `SparseOptimizer.state_shape`: None for SGD)."""

    table: int
    row0: int
    col0: int
    weight: torch.Tensor
    state: torch.Tensor | None
    replicated: bool  # a data-parallel table: every rank holds the same whole table
    rows: torch.Tensor | None = None  # the shard's row ids when not rows row0.. (hot/cold parts)


def allowed_shardings(kind: str, backend: str, optimizer: str) -> list[str]:
    """The sharding kinds the planner may pick for `--sharding kind` on this backend."""
    if kind not in SHARDINGS:
        raise ShardingError(f"--sharding: expected one of {', '.join(SHARDINGS)}, got {kind!r}")
    usable = list(SHARDINGS[1:]) if backend == "nccl" else list(GLOO_SHARDINGS)
    by_column = SparseOptimizer(optimizer).splits_by_column
    if not by_column:
        usable.remove("column_wise")
    if kind == "auto":
        return usable
    if kind == "row_wise" and "row_wise" not in usable:
        raise ShardingError(
            f"--sharding row_wise: needs the nccl backend (row-wise shards reduce-scatter their "
            f"outputs, which {backend} cannot); use table_wise, column_wise or data_parallel"
        )
    if kind == "column_wise" and not by_column:
        raise ShardingError(
            f"--sharding column_wise: not with --optimizer {optimizer} (each column shard would "
            "keep its own row-wise state over its columns only, not the single-process update)"
        )
    return [kind]


def _fused_params(opt: SparseOptimizer) -> dict:
    return {"optimizer": opt.fbgemm_type(), "learning_rate": opt.learning_rate, "eps": opt.eps}


def apply_rule(
    opt: SparseOptimizer,
    lr: float,
    weight: torch.Tensor,
    grad: torch.Tensor,
    state: torch.Tensor | None,
) -> None:
    """`opt`'s update (embeddings/optimizer.py) of a whole table from its dense gradient: rows
    whose gradient is zero keep their weights and state exactly, as in the fused kernels."""
    if not opt.has_state:
        weight.add_(grad, alpha=-lr)
        return
    assert state is not None
    opt.accumulate_(state, grad)
    weight.addcdiv_(grad, opt.denominator_(state.clone()), value=-lr)


class FullTableLoads:
    """Loading full tables (`<table>.weight` and one optimizer state per table, as every
    collection saves them) into a collection that holds its tables in pieces: each table is
    checked whole, then `copy_in(full, "weight" | "state")` places the pieces this rank holds."""

    tables: list[TableSpec]
    optimizer: SparseOptimizer

    def copy_in(self, full: dict[int, torch.Tensor], which: str) -> None:
        raise NotImplementedError

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        mine = {f"{prefix}{t.name}.weight": i for i, t in enumerate(self.tables)}
        for key, i in mine.items():
            if key not in state_dict:
                missing_keys.append(key)
                continue
            t = self.tables[i]
            src = state_dict[key]
            if tuple(src.shape) != (t.num_embeddings, t.embedding_dim):
                error_msgs.append(
                    f"{key}: shape {tuple(src.shape)} in the checkpoint, "
                    f"{(t.num_embeddings, t.embedding_dim)} in the model"
                )
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in mine)
        if error_msgs or any(k in missing_keys for k in mine):
            return
        self.copy_in({i: state_dict[k] for k, i in mine.items()}, "weight")

    def load_sparse_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not self.optimizer.has_state:
            return
        keys = {i: self._state_key(t) for i, t in enumerate(self.tables)}
        missing = sorted(k for k in keys.values() if k not in state)
        if missing:
            raise KeyError(f"sparse optimizer state: missing {', '.join(missing[:3])}")
        for i, key in keys.items():
            t = self.tables[i]
            want = self.optimizer.state_shape(t.num_embeddings, t.embedding_dim)
            if tuple(state[key].shape) != want:
                raise ValueError(
                    f"sparse optimizer state: {key} has shape {tuple(state[key].shape)}, expected {want}"
                )
        self.copy_in({i: state[k] for i, k in keys.items()}, "state")


class ShardedEmbeddingBagCollection(FullTableLoads, EmbeddingCollection):
    """Every table sharded across the process group by torchrec's planner."""

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer,
        device: torch.device,
        sharding: str = "auto",
        seed: int = 0,
        min_column_shard: int | None = None,
    ) -> None:
        """`min_column_shard`: the narrowest column shard the planner may cut (torchrec's
        `min_partition`; default its own, 32 columns)."""
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.distributed import DistributedModelParallel
        from torchrec.distributed.comm_ops import get_gradient_division
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import (
            EmbeddingShardingPlanner,
            ParameterConstraints,
            Topology,
        )

        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise ShardingError("sharded tables need a process group (torch.distributed)")
        if not get_gradient_division():
            raise ShardingError("torchrec's gradient division is off: the updates would be wrong")
        self.tables = list(tables)
        self.feature_names = [t.feature_name for t in tables]
        self.dims = [t.embedding_dim for t in tables]
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        backend = dist.get_backend()
        kinds = allowed_shardings(sharding, backend, optimizer.kind)
        configs = [
            EmbeddingBagConfig(
                name=t.name,
                embedding_dim=t.embedding_dim,
                num_embeddings=t.num_embeddings,
                feature_names=[t.feature_name],
            )  # fmt: skip
            for t in tables
        ]
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        sharder = EmbeddingBagCollectionSharder(fused_params=_fused_params(optimizer))
        extra = {} if min_column_shard is None else {"min_partition": min_column_shard}
        constraints = {t.name: ParameterConstraints(sharding_types=kinds, **extra) for t in tables}
        topology = Topology(
            world_size=self.world_size,
            compute_device="cuda" if self.device.type == "cuda" else "cpu",
        )
        planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
        self.plan = planner.collective_plan(ebc, [sharder], dist.GroupMember.WORLD)
        dmp = DistributedModelParallel(ebc, device=self.device, plan=self.plan, sharders=[sharder])
        # Data-parallel tables: torchrec wraps them in DDP; a communication hook on that DDP
        # applies the optimizer's rule to each all-reduced (averaged) gradient bucket.
        self._replicated = {
            name.split(".")[-2]: p
            for name, p in dmp.named_parameters()
            if self._table_plan(name.split(".")[-2]).sharding_type == "data_parallel"
        }
        self._replicated_state: dict[str, torch.Tensor] = {}
        self._lr = optimizer.learning_rate
        if self._replicated:
            self._hook_replicated(dmp)
        object.__setattr__(self, "_dmp", dmp)  # not a submodule: see embeddings/collection.py
        self.backend = f"torchrec({'+'.join(sorted(self.sharding_kinds()))})"
        self._init_tables(seed)

    # --- the plan ------------------------------------------------------------------------------

    def _table_plan(self, table_name: str):
        return self.plan.plan[""][table_name]  # the module path of the EBC DMP wraps: ""

    def sharding_kinds(self) -> set[str]:
        return {self._table_plan(t.name).sharding_type for t in self.tables}

    def plan_table(self) -> list[dict]:
        """Per table: its sharding kind and every shard's place (rank, row and column offsets and
        sizes), for the run directory."""
        out = []
        for t in self.tables:
            ps = self._table_plan(t.name)
            shards = []
            if ps.sharding_spec is not None:
                for s in ps.sharding_spec.shards:
                    shards.append({
                        "rank": s.placement.rank(),
                        "offsets": list(s.shard_offsets),
                        "sizes": list(s.shard_sizes),
                    })  # fmt: skip
            out.append({
                "table": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim,
                "sharding": ps.sharding_type, "kernel": ps.compute_kernel,
                "ranks": sorted({s["rank"] for s in shards}) if shards else list(range(self.world_size)),
                "shards": shards,
            })  # fmt: skip
        return out

    def plan_text(self) -> str:
        return str(self.plan)

    # --- local storage ---------------------------------------------------------------------------

    def local_shards(self) -> list[LocalShard]:
        """The shards this rank holds (views of the live weights and optimizer state); no
        communication."""
        dmp = self._dmp
        index = {t.name: i for i, t in enumerate(self.tables)}
        weights = dmp.state_dict()
        states = dmp.fused_optimizer.state_dict()["state"] if self.optimizer.has_state else {}
        out: list[LocalShard] = []
        for key, value in weights.items():
            name = key.split(".")[-2]
            i = index[name]
            if name in self._replicated:
                p = self._replicated[name]
                out.append(LocalShard(i, 0, 0, p.data, self._replicated_state.get(name), True))
                continue
            state_shards = {}
            if key in states:  # a table with no shard here has no entry
                state = states[key][self.optimizer.torchrec_state_key(name)]  # a ShardedTensor
                state_shards = {
                    tuple(s.metadata.shard_offsets): s.tensor for s in state.local_shards()
                }
            for s in value.local_shards():
                r0, c0 = s.metadata.shard_offsets
                st = state_shards.get((r0, c0)) if states else None
                if st is None and states:  # row-wise state: offsets of the rows only
                    st = state_shards.get((r0,))
                out.append(LocalShard(i, r0, c0, s.tensor, st, False))
        return out

    def _hook_replicated(self, dmp) -> None:
        """A communication hook on torchrec's DDP of the data-parallel tables: all-reduce
        (average) each gradient bucket, then apply the optimizer's rule to every table in it.
        DDP reduces the kernel's one flat weight tensor; each table is a slice of it."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        for name, p in self._replicated.items():
            state = self.optimizer.zero_state(p.shape[0], p.shape[1], device=p.device)
            if state is not None:
                self._replicated_state[name] = state
        # torchrec keeps the DDP-wrapped lookups in a plain list (not submodules)
        ddps = [m for m in dmp.module._lookups if isinstance(m, DistributedDataParallel)]
        covered = 0
        for ddp in ddps:
            layout = self._table_slices(list(ddp.parameters()))
            covered += sum(len(v) for v in layout.values())
            ddp.register_comm_hook(dist.GroupMember.WORLD, self._reduce_then_update(layout))
        if covered != len(self._replicated):
            raise ShardingError("data-parallel tables: torchrec did not wrap them all in DDP")
        self._allreduce_hook = allreduce_hook

    def _table_slices(self, flats: list[torch.Tensor]) -> dict[int, list[tuple[str, int]]]:
        """Per flat parameter (by id), the data-parallel tables inside it and their offsets."""
        out: dict[int, list[tuple[str, int]]] = {}
        for flat in flats:
            base, end = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
            for name, p in self._replicated.items():
                if base <= p.data_ptr() < end:
                    offset = (p.data_ptr() - base) // flat.element_size()
                    out.setdefault(id(flat), []).append((name, offset))
        return out

    def _reduce_then_update(self, layout: dict[int, list[tuple[str, int]]]):
        def hook(group, bucket):
            def update(fut):
                value = fut.value()
                grads = value[0] if isinstance(value, list) else value
                start = 0
                with torch.no_grad():
                    for flat in bucket.parameters():
                        for name, offset in layout.get(id(flat), []):
                            p = self._replicated[name]
                            at = start + offset
                            g = grads[at : at + p.numel()].view_as(p)
                            apply_rule(
                                self.optimizer,
                                self._lr,
                                p.data,
                                g,
                                self._replicated_state.get(name),
                            )
                        start += flat.numel()
                    grads.zero_()  # applied: nothing may accumulate into the next step
                return grads

            return self._allreduce_hook(group, bucket).then(update)

        return hook

    def _init_tables(self, seed: int) -> None:
        with torch.no_grad():
            for shard in self.local_shards():
                t = self.tables[shard.table]
                full = uniform_table(t.num_embeddings, t.embedding_dim, shard.table, seed)
                rows, cols = shard.weight.shape
                shard.weight.copy_(
                    full[shard.row0 : shard.row0 + rows, shard.col0 : shard.col0 + cols]
                )

    # --- the collection contract ---------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        out = self._dmp(features)
        out = out.wait() if hasattr(out, "wait") else out
        if list(out.keys()) == self.feature_names:
            return out
        parts = out.to_dict()
        values = torch.cat([parts[f] for f in self.feature_names], dim=1)
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=values)

    def set_learning_rate(self, lr: float) -> None:
        fused = self._dmp.fused_optimizer
        for group in fused.param_groups:
            group["lr"] = float(lr)
        fused.step()  # applies the new rate to the kernels (the update itself runs in backward)
        self._lr = float(lr)

    def _gathered(self, which: str) -> list[torch.Tensor | None]:
        """Every table whole on every rank: each rank fills in its shards, zeros elsewhere, and
        an all-reduce adds them up (shards are disjoint; a replicated table counts from rank 0)."""
        full: list[torch.Tensor | None] = []
        for t in self.tables:
            if which == "state":
                full.append(
                    self.optimizer.zero_state(t.num_embeddings, t.embedding_dim, self.device)
                )
            else:
                full.append(torch.zeros(t.num_embeddings, t.embedding_dim, device=self.device))
        for s in self.local_shards():
            dst = full[s.table]
            src = s.weight if which == "weight" else s.state
            if dst is None or src is None or (s.replicated and self.rank != 0):
                continue
            rows = src.shape[0]
            if src.dim() == 1:
                dst[s.row0 : s.row0 + rows] = src
            else:
                dst[s.row0 : s.row0 + rows, s.col0 : s.col0 + src.shape[1]] = src
        for f in full:
            if f is not None:
                dist.all_reduce(f)
        return full

    def table_weights(self) -> list[torch.Tensor]:
        """Every table whole (a collective: every rank must call it); copies, not views."""
        return self._gathered("weight")  # type: ignore[return-value]

    def optimizer_states(self) -> list[torch.Tensor | None]:
        """Every table's optimizer state whole (a collective, as `table_weights`)."""
        return self._gathered("state")

    def copy_in(self, full: dict[int, torch.Tensor], which: str) -> None:
        """Each shard's part of the full tables `full[table]` into its weights or state."""
        with torch.no_grad():
            for s in self.local_shards():
                dst = s.weight if which == "weight" else s.state
                if dst is None:
                    continue
                src = full[s.table]
                rows = dst.shape[0]
                if dst.dim() == 1:
                    dst.copy_(src[s.row0 : s.row0 + rows])
                else:
                    dst.copy_(src[s.row0 : s.row0 + rows, s.col0 : s.col0 + dst.shape[1]])

    def counters(self) -> dict:
        return no_transfer_counters()

    def placement_info(self) -> dict:
        kinds = sorted(self.sharding_kinds())
        return {"kind": "sharded", "backend": self.backend, "sharding": kinds,
                "world_size": self.world_size}  # fmt: skip

    def replicated_across_ranks(self) -> bool:
        """The ranks' shards are kept in step by the sharding itself (one home per sharded row,
        all-reduced gradients for replicated tables)."""
        return True
