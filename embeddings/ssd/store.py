"""The SSD tier as a staged collection's cold store: a `RowStore` (embeddings/row_store.py) over
`ScmTier` (embeddings/ssd/tier.py), with the concerns that are the tier's, not the collection's:

- initial values: `row_init.hashed_rows` for every row (a pure function of seed, table and row, so
  rows never written need not be stored), hot rows included;
- checkpoints do not copy the tier: `begin_checkpoint` flushes the row cache and marks a consistent
  point of the files (a generation, embeddings/ssd/journal.py), and the checkpoint holds that generation, the
  tier's id and its map of written blocks; loading them rolls the files back to that point;
- the time the training step's own thread spends in the tier (write-backs, renewals of staged
  rows), apart from the staging worker's reads;
- its counters (`scm_*`) and its description in the summary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from embeddings.row_init import hashed_rows
from embeddings.row_store import RowStore
from embeddings.ssd.tier import ScmTier

_CHUNK = 1 << 18  # rows per piece when initial rows are made

# the counters a metrics.jsonl train event carries (the summary carries every counter)
LOGGED = (
    "scm_cache_hits", "scm_cache_misses", "scm_cache_hit_rate", "scm_rows_read", "scm_bytes_read",
    "scm_read_amplification", "scm_blocks_read", "scm_rows_per_block_read", "scm_writeback_bytes",
    "scm_io_p50_us", "scm_io_p99_us", "scm_queue_depth", "scm_exposed_io_s_per_step",
)  # fmt: skip


class ScmStore(RowStore):
    """Rows by global id in the SSD tier `tier`."""

    name = "ssd"
    own_files = True
    checkpoint_keys = ("scm_generation", "scm_tier_id", "scm_materialised")

    def __init__(self, tier: ScmTier) -> None:
        self.tier = tier
        self.backend = f"{tier.io}/{tier.file.engine}"
        self.step_io_s = 0.0  # time the step's own thread spent in the tier
        self.step_io_cpu_s = 0.0  # the CPU time of it (the rest: waiting for the lock or the disk)
        self._generation: int | None = None  # the point a checkpoint in progress marked

    # --- rows -------------------------------------------------------------------------------------

    def holds(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tier.holds(ids)

    def read_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.tier.read_rows(ids)

    def write_rows(
        self, ids: torch.Tensor, weights: torch.Tensor, state: torch.Tensor | None
    ) -> None:
        self.tier.write_rows(ids, weights, state)

    def give_rows(
        self, ids: torch.Tensor, weights: torch.Tensor, state: torch.Tensor | None
    ) -> None:
        self.tier.write_rows(ids, weights, state, given=True)

    def peek_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.tier.split_rows(self.tier.peek_rows(ids))

    @torch.no_grad()
    def init_rows(self, table: int, rows: torch.Tensor, out: torch.Tensor) -> None:
        """A piece at a time: made whole beside their copy the rows took as many bytes again
        (0.5 GB of 1 GB of DRAM)."""
        t = self.tier
        for a in range(0, rows.numel(), _CHUNK):
            part = hashed_rows(rows[a : a + _CHUNK], t.dim, table, t.sizes[table], t.seed)
            out[a : a + part.shape[0]] = part.to(out.device)

    @contextmanager
    def step_io(self) -> Iterator[None]:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.step_io_s += time.perf_counter() - t0
            self.step_io_cpu_s += time.thread_time() - c0

    # --- checkpoints: a consistent point of the tier's files --------------------------------------

    def begin_checkpoint(self) -> bool:
        self._generation = self.tier.prepare()
        return True

    def end_checkpoint(self, written: bool) -> None:
        generation, self._generation = self._generation, None
        if written and generation is not None:
            self.tier.commit(generation)

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return {
            "scm_generation": torch.tensor(self._generation, dtype=torch.int64),
            "scm_tier_id": torch.tensor(list(self.tier.tier_id), dtype=torch.uint8),
            "scm_materialised": torch.from_numpy(self.tier.materialised.copy()),
        }

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        self.tier.restore(
            int(state["scm_generation"]), bytes(state["scm_tier_id"].tolist()),
            state["scm_materialised"].numpy().astype(bool),
        )  # fmt: skip

    # --- what the run reports ---------------------------------------------------------------------

    def counters(self, collection: dict) -> dict:
        out = self.tier.counters()
        steps = max(1, collection.get("hotline_batches") or 0)
        exposed = (collection.get("exposed_gather_s") or 0.0) + self.step_io_s
        out["scm_step_io_s"] = round(self.step_io_s, 4)
        out["scm_step_io_cpu_s"] = round(self.step_io_cpu_s, 4)
        out["scm_exposed_io_s_per_step"] = round(exposed / steps, 6)
        return out

    def logged_counters(self) -> tuple[str, ...]:
        return LOGGED

    def placement_info(self, rows: int, row_bytes: int) -> dict:
        tier = self.tier
        return {
            "scm_dir": str(tier.dir),
            "scm_io": tier.io,
            "scm_io_threads": tier.io_threads,
            "scm_cache_rows": tier.cache.capacity,
            "scm_cache_bytes": tier.cache.capacity * tier.row_bytes,
            "scm_dram_bytes": tier.dram_bytes(),
            "scm_rows_per_block": tier.rpb,
            "scm_layout": tier.row_layout.kind,
            "scm_layout_rows": tier.row_layout.num_placed,
            "ssd_tier_bytes": rows * row_bytes,
        }

    def summary_parts(self, counters: dict) -> dict[str, dict]:
        """`ssd_tier`: the tier's counters (its row cache's hit rate first), without the `scm_`
        prefix the placement's flat counters carry."""
        part = {"cache_hit_rate": counters.get("scm_cache_hit_rate")}
        part.update((k.removeprefix("scm_"), v) for k, v in counters.items())
        part["cache_capacity_rows"] = self.tier.cache.capacity
        part["layout"] = self.tier.row_layout.kind
        part["layout_rows"] = self.tier.row_layout.num_placed
        return {"ssd_tier": part}

    def describe(self) -> str:
        t = self.tier
        return f"SSD tier in {t.dir} ({t.io} I/O), row cache of {t.cache.capacity} rows"
