"""The embedding-collection contract: what every way of storing embedding rows offers.

Models and the trainer hold a collection and never ask which one: where rows live (one device,
host and device tiers, an SSD file) is the collection's business. The contract has two parts.

`EmbeddingLookup`, what inference needs (the quantized collections implement only this): the face
of torchrec's `EmbeddingBagCollection` (`forward(kjt) -> KeyedTensor`, keys in feature order), plus

- full-table export whatever the placement: `table_weights()` is every row of every table as
  float32, current (after `sync()`), and `state_dict()` is placement-independent
  (`<table>.weight`, one tensor per table); a lookup-only collection is built from its rows and
  refuses to load a state dict (weights given to it would be silently unused);
- `sync()` makes every tier current (before evaluation and exports);
- `counters()` for metrics.jsonl / summary.json: every collection the same keys (bytes per
  link and purpose, syncs, FAE's hot/cold counts; see `transfer_stats.py`), so the trainer
  prints them without asking which collection it has; `placement_info()` for the summary's
  description of where rows live.

`EmbeddingCollection`, a lookup that trains, adds:

- sparse updates are fused into backward, so `forward`'s output needs no optimizer step; the
  learning rate is pushed in with `set_learning_rate`;
- `optimizer_states()` (every row's fused optimizer state), `rows_of()`, and a `state_dict()`
  that loads back, so checkpoints move between placements;
- `begin_checkpoint()` / `end_checkpoint(written)` around a checkpoint (a tier with files of its
  own marks a consistent point of them, and its checkpoint then holds that point, not its rows);
- `extra_state()` / `load_extra_state()`: tensors a checkpoint must carry beyond the weights and
  optimizer state (counters, caches' bookkeeping) so a resumed run continues exactly;
- `last_step_kind()`: what kind of step the last training forward was, for collections whose
  steps differ (FAE: "hot" or "cold"), so the trainer can time them apart.

Tables are deliberately not registered parameters: their fused optimizer updates them inside
backward, so they must not reach the dense optimizer through `.parameters()` (and a data-parallel
wrapper would not keep them in step across ranks: see `replicated_across_ranks`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch
from torch import nn

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.row_layout import flat_rows, table_row_base
from embeddings.transfer_stats import LOGGED_COUNTERS

if TYPE_CHECKING:
    pass


class EmbeddingLookup(nn.Module, ABC):
    """Sum-pooled embedding bags for many features: lookups and full-table export."""

    tables: list[TableSpec]
    feature_names: list[str]
    dims: list[int]
    device: torch.device
    backend: str  # how lookups run, for people (e.g. "fbgemm", "fae(host=fbgemm, device=torch)")

    @abstractmethod
    def forward(self, features):  # KeyedJaggedTensor -> KeyedTensor
        """Pooled embeddings, keys in `feature_names` order (any key order in)."""

    @abstractmethod
    def table_weights(self) -> list[torch.Tensor]:
        """Every table as one [rows, dim] float tensor, current. Views where the storage allows
        (a trainable collection: after writing into them call `after_tables_written()`)."""

    def sync(self) -> None:
        """Make every tier current (before evaluation, checkpoints and exports)."""

    @abstractmethod
    def counters(self) -> dict[str, int | float | None]:
        """Counters for metrics.jsonl and summary.json, `TransferStats.as_dict()`'s keys: bytes
        per link and purpose (`emb_bytes_h2d_lookup`, ...), `syncs`, `sync_rows`, `sync_s`,
        `hot_batches`, `cold_batches`, `train_inputs`, `hot_inputs`, `hot_input_share`,
        `emb_bytes_per_sample` (a collection that moves nothing: `no_transfer_counters()`)."""

    def logged_counters(self) -> tuple[str, ...]:
        """Which `counters()` a metrics.jsonl train event carries (the summary: all of them)."""
        return LOGGED_COUNTERS

    @abstractmethod
    def placement_info(self) -> dict:
        """Where rows live, for the summary: at least `kind` ("device", "host", "fae", ...) and
        `backend`."""

    def summary_parts(self) -> dict[str, dict]:
        """summary.json's parts of the capabilities this collection uses beyond its placement
        (a staged collection's SSD tier: `{"ssd_tier": {...}}`); none by default."""
        return {}

    # --- placement-independent state dict: `<table>.weight`, one full tensor per table ----------

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: D401
        for t, w in zip(self.tables, self.table_weights()):
            destination[f"{prefix}{t.name}.weight"] = w if keep_vars else w.detach()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # built from its rows, never loaded: float weights given to it would be silently unused
        mine = [k for k in state_dict if k.startswith(prefix)]
        if mine:
            error_msgs.append(f"{mine[0]}: a lookup-only collection is built from its rows")


class EmbeddingCollection(EmbeddingLookup):
    """A lookup that trains: sparse optimizer fused into backward, checkpoints, resumes."""

    optimizer: SparseOptimizer

    # --- training ------------------------------------------------------------------------------

    @abstractmethod
    def set_learning_rate(self, lr: float) -> None:
        """The fused sparse optimizer's learning rate from the next backward on."""

    def last_step_kind(self) -> str | None:
        """The kind of the last training forward when a collection has several (FAE: "hot" or
        "cold"); None when every step is alike."""
        return None

    # --- optimizer state and rows, whatever the placement ----------------------------------------

    @abstractmethod
    def optimizer_states(self) -> list[torch.Tensor | None]:
        """Per table the fused optimizer's state ([rows, dim] for Adagrad, [rows] for row-wise
        Adagrad), None for SGD; current, views where the storage allows."""

    def rows_of(
        self, tables: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The current weights [n, dim] and optimizer state ([n, dim], [n] or None) of rows
        (`tables[i]`, `rows[i]`), on the CPU: a few rows without exporting whole tables (what
        Slipstream snapshots). Every table must have the same width."""
        if len(set(self.dims)) != 1:
            raise ValueError("rows_of: every table must have the same width")
        tables, rows = torch.as_tensor(tables).long(), torch.as_tensor(rows).long()
        out = []
        for views in (self.table_weights(), self.optimizer_states()):
            if views[0] is None:
                out.append(None)
                continue
            flat = flat_rows(views)
            if flat is None:  # tables in separate buffers: joined first (a copy)
                flat = torch.cat([v.detach() for v in views])
            base = table_row_base([v.shape[0] for v in views])
            out.append(flat[(rows + base[tables]).to(flat.device)].detach().cpu())
        return out[0], out[1]

    def after_tables_written(self) -> None:
        """Called after `table_weights()` / `optimizer_states()` were written into, so copies
        of those rows elsewhere (another tier) are refreshed. `load_state_dict` and
        `load_sparse_state_dict` call it themselves."""

    def sparse_state_dict(self) -> dict[str, torch.Tensor]:
        """The fused optimizer's state, one tensor per table, for checkpoints."""
        return {
            self._state_key(t): s.detach()
            for t, s in zip(self.tables, self.optimizer_states())
            if s is not None
        }

    def load_sparse_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        dst = {
            self._state_key(t): s
            for t, s in zip(self.tables, self.optimizer_states())
            if s is not None
        }
        missing = sorted(set(dst) - set(state))
        if missing:
            more = "..." if len(missing) > 3 else ""
            raise KeyError(f"sparse optimizer state: missing {', '.join(missing[:3])}{more}")
        with torch.no_grad():
            for key, d in dst.items():
                s = state[key]
                if tuple(s.shape) != tuple(d.shape):
                    raise ValueError(
                        f"sparse optimizer state: {key} has shape {tuple(s.shape)}, "
                        f"expected {tuple(d.shape)}"
                    )
                d.copy_(s)
        self.after_tables_written()

    def _state_key(self, table: TableSpec) -> str:
        return f"{table.name}.{self.optimizer.kind}_state"

    # --- loading the placement-independent state dict ------------------------------------------

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        mine = {f"{prefix}{t.name}.weight": w for t, w in zip(self.tables, self.table_weights())}
        for key, dst in mine.items():
            if key not in state_dict:
                missing_keys.append(key)
                continue
            src = state_dict[key]
            if tuple(src.shape) != tuple(dst.shape):
                error_msgs.append(
                    f"{key}: shape {tuple(src.shape)} in the checkpoint, {tuple(dst.shape)} in the model"
                )
                continue
            with torch.no_grad():
                dst.copy_(src)
        # A collection registers no submodules, so anything else under its prefix is not ours.
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in mine)
        self.after_tables_written()

    # --- checkpoints -----------------------------------------------------------------------------

    def begin_checkpoint(self) -> None:
        """Before a checkpoint's state is taken: every tier current. A tier with files of its own
        (the SSD tier) also flushes them and marks a consistent point they can be rolled back to."""
        self.sync()

    def end_checkpoint(self, written: bool) -> None:
        """After the checkpoint file was written (`written`) or failed to be."""

    def checkpoint_bytes(self) -> int:
        """Bytes of rows (weights and optimizer state) a checkpoint holds: every row but those a
        file tier keeps in its own files."""
        opt = self.optimizer
        return 4 * sum(
            t.num_embeddings * (t.embedding_dim + opt.state_floats(t.embedding_dim))
            for t in self.tables
        )

    def extra_state(self) -> dict[str, torch.Tensor]:
        """Tensors a checkpoint must carry beyond weights and optimizer state."""
        return {}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `extra_state` returned (keys it does not know are an error)."""
        unknown = sorted(state)
        if unknown:
            raise KeyError(
                f"embedding collection: unexpected checkpoint state {', '.join(unknown[:3])}"
            )

    # --- processes -------------------------------------------------------------------------------

    def replicated_across_ranks(self) -> bool:
        """True when every rank of a process group holds and updates the same rows and keeps them
        in step itself. The collections here are single-process: each rank would update its own
        copy and the copies would drift, so the trainer refuses them with a process group."""
        return False
