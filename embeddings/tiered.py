"""`--placement tiered`: hot rows in the device tier, every other row's home an SSD file behind a
DRAM row cache (embeddings/scm_tier.py), behind the embedding-collection contract.

It is Hotline's structure (embeddings/hotline.py) with the SSD tier as the cold rows' home: a
mini-batch's cold rows are staged by the Hotline train pipeline on its worker, mini-batches
ahead (the prefetch: cache misses are read from the file while the current step computes),
loaded into the device tier's staging slots, trained there in one fused step, and written back
to the tier (into the row cache, dirty) when the next step loads. Every row has one home; the
cache holds copies that are written back on eviction and before checkpoints.

Initial values are `row_init.hashed_rows` for every row, hot or cold (a pure function of seed,
table and row, so untouched rows need not be stored); `--placement device --embedding-init
hashed` starts from the same values.

Checkpoints do not copy the tier: `begin_checkpoint` flushes the cache and marks a consistent
point of the files (a generation, scm_journal.py), and the state dict then holds the hot rows,
that generation, the tier's id and its map of written blocks; loading it rolls the files back to
that point. Outside a checkpoint the state dict is the contract's full tables (exports, tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError
from embeddings.hotline import HotlineEmbeddingBagCollection
from embeddings.plan import EXPLICIT, REST, PlacementPlan, TierPlan
from embeddings.row_init import hashed_rows
from embeddings.scm_tier import ScmTier

_CHUNK = 1 << 18  # rows per piece when whole tables are assembled or written
_KEYS = ("hot_gids", "hot_weight", "hot_state", "scm_generation", "scm_tier_id", "scm_materialised")


@dataclass
class ScmSettings:
    """Where and how the SSD tier keeps its rows (`--scm-dir`, `--scm-cache`, `--scm-io`)."""

    directory: str
    cache_bytes: int
    io: str = "direct"
    io_threads: int = 16
    io_engine: str = "auto"  # aio | threads | auto (embeddings/scm_file.py)
    io_depth: int = 64
    resume: bool = False  # keep the files for a checkpoint's restore
    owner: str = ""  # the run directory (a tier directory serves one run)


def profile_priority(counts: list[np.ndarray], sizes: list[int]):
    """`priority(gids)` for the row cache: each row's count in the access profile (0 when
    unseen), kept as the seen rows only (sorted global ids and their counts)."""
    base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    small = int(sum(sizes)) < 2**31  # global ids as int32 (Terabyte's 260M rows: half the bytes)
    ids = [
        (np.flatnonzero(c) + b).astype(np.int32 if small else np.int64)
        for c, b in zip(counts, base)
    ]
    gids = torch.from_numpy(np.concatenate(ids))
    vals = torch.from_numpy(np.concatenate([c[c > 0] for c in counts]).astype(np.int32))
    if not gids.numel():
        return None

    def priority(g: torch.Tensor) -> torch.Tensor:
        key = g.to(gids.dtype)
        at = torch.searchsorted(gids, key).clamp(max=gids.numel() - 1)
        return torch.where(gids[at] == key, vals[at].long(), torch.zeros_like(g))

    return priority


class TieredEmbeddingBagCollection(HotlineEmbeddingBagCollection):
    """Hot rows on the device, the rest only in the SSD tier, cold rows staged per step."""

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer,
        plan: PlacementPlan,
        scm: ScmSettings,
        device: torch.device | str | None = None,
        backend: str = "auto",
        seed: int = 0,
        priority=None,
        staging_rows: int = 0,
    ) -> None:
        if plan is None:
            raise PlacementError(
                "tiered placement: needs a plan (popularity is not learned online)"
            )
        object.__setattr__(self, "_scm", scm)
        object.__setattr__(self, "_priority", priority)
        super().__init__(tables, optimizer, plan, device, backend, seed, staging_rows)
        self.backend = f"tiered(ssd={scm.io}/{self.host.file.engine}, device={self.fast.backend})"
        self.host.held = lambda ids: self.hot_map.slots(ids) < 0  # the hot rows' home: device
        self._checkpoint_generation: int | None = None
        self._restored = False
        self.step_io_s = (
            0.0  # time the step's own thread spent in the tier (write-backs, refreshes)
        )
        self.step_io_cpu_s = 0.0  # the CPU time of it (the rest: waiting for the lock or the disk)

    # --- tiers ------------------------------------------------------------------------------------

    def _cold_tier(self, plan: PlacementPlan | None) -> ScmTier:
        s = self._scm
        return ScmTier(
            s.directory, self.tables, self.optimizer, self.seed, s.cache_bytes,
            held=None, io=s.io, io_threads=s.io_threads, priority=self._priority,
            resume=s.resume, owner=s.owner, io_engine=s.io_engine, io_depth=s.io_depth,
        )  # fmt: skip

    def _one_home(self, plan: PlacementPlan) -> PlacementPlan:
        plan.check_fits(
            self.feature_names, self.sizes, self.dims, self.optimizer.kind, "placement plan"
        )
        device = plan.tier("device")
        if device.rows != EXPLICIT:
            raise PlacementError("placement plan: the device tier must list its rows")
        tiers = [device, TierPlan("ssd", REST, None, None)]
        return PlacementPlan(
            plan.feature_names, plan.table_sizes, plan.dims, plan.optimizer, tiers, False,
            dict(plan.report),
        )  # fmt: skip

    @torch.no_grad()
    def _init_hot_rows(self, gids: torch.Tensor) -> None:
        """The hot rows' `hashed_rows` values, written into the device tier a piece at a time
        (made whole beside their copy they took as many bytes again: 0.5 GB of 1 GB of DRAM)."""
        for t in range(len(self.tables)):
            rows = self.hot_map.table_hot(t)  # in slot order
            start = int(self.table_start[t])
            for a in range(0, rows.numel(), _CHUNK):
                part = hashed_rows(rows[a : a + _CHUNK], self.dim, t, self.sizes[t], self.seed)
                self._w[start + a : start + a + part.shape[0]] = part.to(self.device)

    def adopt(self, plan: PlacementPlan) -> None:
        raise PlacementError("tiered placement: the plan is fixed when the collection is built")

    def forward(self, features):
        if self.training and torch.is_grad_enabled():  # a checkpoint left unfinished is over
            self._checkpoint_generation = None
        return super().forward(features)

    # --- the step's own time in the tier ----------------------------------------------------------

    def _write_back(self) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        super()._write_back()
        self.step_io_s += time.perf_counter() - t0
        self.step_io_cpu_s += time.thread_time() - c0

    def _refresh(self, staged, prev) -> int:
        t0, c0 = time.perf_counter(), time.thread_time()
        out = super()._refresh(staged, prev)
        self.step_io_s += time.perf_counter() - t0
        self.step_io_cpu_s += time.thread_time() - c0
        return out

    # --- full tables, from the device tier and the SSD tier ---------------------------------------

    def _assemble(self, state: bool) -> list[torch.Tensor | None]:
        if state and self.optimizer.kind == "sgd":
            return [None] * len(self.tables)
        self.sync()
        out = []
        lo, hi = (self.dim, None) if state else (0, self.dim)
        for t, n in enumerate(self.sizes):
            base = int(self.row_base[t])
            shape = (n, self.dim) if (not state or self.optimizer.kind == "adagrad") else (n,)
            full = torch.empty(shape, dtype=torch.float32)
            hot, cold = self._hot_and_cold(t)
            for a in range(0, cold.numel(), _CHUNK):
                rows = cold[a : a + _CHUNK]
                part = self.host.peek_rows(rows + base)[:, lo:hi]
                full[rows] = part.reshape((rows.numel(), *shape[1:]))
            if hot.numel():
                src = self._s if state else self._w
                full[hot] = (
                    src[self._hot_slots(hot + base)].cpu().reshape((hot.numel(), *shape[1:]))
                )
            out.append(full)
        return out

    @torch.no_grad()
    def after_tables_written(self) -> None:
        weights, states = self._export.get("weight"), self._export.get("state")
        if weights is None and states is None:
            return
        self._write_back()
        for t in range(len(self.sizes)):
            base = int(self.row_base[t])
            hot, cold = self._hot_and_cold(t)
            if hot.numel():
                at = self._hot_slots(hot + base)
                if weights is not None:
                    self._w[at] = weights[t][hot].to(self.device)
                if states is not None:
                    self._s[at] = states[t][hot].reshape(self._s[at].shape).to(self.device)
            for a in range(0, cold.numel(), _CHUNK):
                rows = cold[a : a + _CHUNK]
                cur = self.host.peek_rows(rows + base)
                w = weights[t][rows] if weights is not None else cur[:, : self.dim]
                s = None
                if self.optimizer.kind != "sgd":
                    s = states[t][rows] if states is not None else cur[:, self.dim :]
                self.host.write_rows(rows + base, w, s)
        self._export.clear()
        self.version += 1
        self._writebacks.clear()

    # --- checkpoints: the hot rows and a consistent point of the tier's files -----------------------

    def begin_checkpoint(self) -> None:
        self.sync()
        self._checkpoint_generation = self.host.prepare()

    def end_checkpoint(self, written: bool) -> None:
        generation, self._checkpoint_generation = self._checkpoint_generation, None
        if written and generation is not None:
            self.host.commit(generation)

    def checkpoint_bytes(self) -> int:
        return self.num_hot * self._row_bytes

    def sparse_state_dict(self) -> dict[str, torch.Tensor]:
        if self._checkpoint_generation is not None:
            return {}  # in the hot rows and the tier's files
        return super().sparse_state_dict()

    def load_sparse_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state and self._restored:
            return
        super().load_sparse_state_dict(state)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self._checkpoint_generation is None:
            super()._save_to_state_dict(destination, prefix, keep_vars)
            return
        slots = self._hot_slots(self.hot_gids)
        tier = self.host
        values = {
            "hot_gids": self.hot_gids.clone(),
            "hot_weight": self._w[slots].cpu(),
            "hot_state": self._s[slots].cpu() if self._s is not None else torch.zeros(0),
            "scm_generation": torch.tensor(self._checkpoint_generation, dtype=torch.int64),
            "scm_tier_id": torch.tensor(list(tier.tier_id), dtype=torch.uint8),
            "scm_materialised": torch.from_numpy(tier.materialised.copy()),
        }
        for k, v in values.items():
            destination[f"{prefix}tiered.{k}"] = v

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        mine = {k: f"{prefix}tiered.{k}" for k in _KEYS}
        if mine["hot_gids"] not in state_dict:  # full tables (a model file, another placement)
            super()._load_from_state_dict(
                state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
            )  # fmt: skip
            return
        missing = [key for key in mine.values() if key not in state_dict]
        if missing:
            missing_keys.extend(missing)
            return
        v = {k: state_dict[key] for k, key in mine.items()}
        unexpected_keys.extend(
            k for k in state_dict if k.startswith(prefix) and k not in mine.values()
        )
        if not torch.equal(v["hot_gids"], self.hot_gids):
            error_msgs.append(f"{prefix}tiered.hot_gids: the checkpoint has another placement plan")
            return
        with torch.no_grad():
            self._write_back()
            slots = self._hot_slots(self.hot_gids)
            self._w[slots] = v["hot_weight"].to(self.device)
            if self._s is not None:
                self._s[slots] = v["hot_state"].reshape(self._s[slots].shape).to(self.device)
        self.host.restore(
            int(v["scm_generation"]), bytes(v["scm_tier_id"].tolist()),
            v["scm_materialised"].numpy().astype(bool),
        )  # fmt: skip
        self._in_slots = None
        self._export.clear()
        self.version += 1
        self._writebacks.clear()
        self._restored = True

    # --- counters and summaries ----------------------------------------------------------------------

    def counters(self) -> dict:
        out = super().counters()
        out.update(self.host.counters())
        steps = max(1, out.get("hotline_batches") or 0)
        exposed = (out.get("exposed_gather_s") or 0.0) + self.step_io_s
        out["scm_step_io_s"] = round(self.step_io_s, 4)
        out["scm_step_io_cpu_s"] = round(self.step_io_cpu_s, 4)
        out["scm_exposed_io_s_per_step"] = round(exposed / steps, 6)
        return out

    def placement_info(self) -> dict:
        info = super().placement_info()
        tier = self.host
        info.update({
            "kind": "tiered",
            "scm_dir": str(tier.dir),
            "scm_io": tier.io,
            "scm_io_threads": tier.io_threads,
            "scm_cache_rows": tier.cache.capacity,
            "scm_cache_bytes": tier.cache.capacity * tier.row_bytes,
            "scm_dram_bytes": tier.dram_bytes(),
            "scm_rows_per_block": tier.rpb,
        })  # fmt: skip
        info.pop("host_tier_bytes", None)
        info["ssd_tier_bytes"] = (self.total_rows - self.num_hot) * self._row_bytes
        return info
