"""The built-in placement kinds (dlrm/placement/kinds.py's `PlacementKind`), one class each:

- `device`:  every table on the training device (the fused collection);
- `host`:    every table in host memory, pooled embeddings sent to the device (CPU-GPU hybrid);
- `fae`:     hot rows replicated on the device, hot mini-batches trained there (embeddings/fae.py);
- `hotline`: hot rows only on the device, the rest only on the host, each mini-batch's cold rows
  staged ahead (embeddings/staged/hotline.py, dlrm/pipelines/staging.py); with
  `--hotline-learn-batches N` the plan is learned over the first N mini-batches instead;
- `tiered`:  hot rows on the device, every other row in an SSD file behind a DRAM row cache
  (dlrm/placement/tiered_setup.py, embeddings/ssd/collection.py).

Torch-free at import (`--help` reads a kind's `help`): what a kind builds is imported in its
methods.
"""

from __future__ import annotations

from typing import Any

from dlrm.errors import ConfigError


class _Kind:
    """What most kinds share: tuned by nothing, no rules beyond the initial rows, no settings of
    their own, the training data as it is."""

    name = ""
    help = ""
    tuned_by: tuple[str, ...] = ()
    preference = 9
    multi_process: str | None = None
    one_home = False
    initial_rows: tuple[str, ...] = ("uniform",)  # --embedding-init values besides auto
    regroups_batches = False

    def check(self, cfg) -> None:
        init = cfg.placing.embedding_init
        if init != "auto" and init not in self.initial_rows:
            from dlrm.placement.kinds import all_kinds

            able = [k.name for k in all_kinds() if init in k.initial_rows]
            raise ConfigError(
                f"--embedding-init {init}: supported by --placement {' and '.join(able)}, "
                f"not {self.name}"
            )

    def settings(self, candidate, cfg) -> dict[str, Any]:
        return {}

    def rows_on_device(self, candidate, total: int) -> int:
        return min(candidate.hot_budget, total) if "hot_budget" in self.tuned_by else 0

    def training_data(self, cfg, data, placed, per_epoch: int):
        return data

    def candidates(self, space) -> list:
        from dlrm.placement.candidates import Candidate

        return [Candidate(self.name)]

    def memory_needs(self, cfg, tables):
        return _layout_needs(cfg, tables, hot_on_device=False, one_home=False, remaps=False)

    def bytes_per_sample(self, candidate, coverage) -> float | None:
        return None

    def __repr__(self) -> str:
        return f"<placement kind {self.name}>"


def _layout_needs(cfg, tables, *, hot_on_device, one_home, remaps, tables_on="host"):
    """Where a kind keeps rows, in bytes per tier, counted as its plan's byte budgets count them
    (weights + optimizer state per row): at most `--hot-budget` of hot rows on the device, the
    tables (every row, or the cold ones where a row has one home) in their tier, the access
    profile's counts while planning."""
    from embeddings.hot_rows import row_bytes
    from embeddings.room import Needs

    opt = cfg.training.sparse_optimizer()
    total = sum(t.num_embeddings * row_bytes(t.embedding_dim, opt) for t in tables)
    rows = sum(t.num_embeddings for t in tables)
    hot = min(cfg.placing.hot_budget.bytes, total)
    needs = Needs()
    if hot_on_device:
        needs.add("device", "hot rows + optimizer state", hot, rows=True)
        if one_home:
            staging = max(cfg.training.mini_batch_size, cfg.training.test_mini_batch_size)
            needs.add("device", "staging slots", staging * total // max(1, rows) * len(tables))
        needs.add("host", "access profile", 4 * rows)
    needs.add(tables_on, "tables + optimizer state", total - (hot if one_home else 0), rows=True)
    if remaps:
        needs.add("host", "placement plan remaps", 4 * rows)
    return needs


class Device(_Kind):
    name = "device"
    help = "every table on the training device (the fused collection)"
    preference = 0
    multi_process = "sharded"
    initial_rows = ("uniform", "hashed")

    def rows_on_device(self, candidate, total: int) -> int:
        return total

    def memory_needs(self, cfg, tables):
        return _layout_needs(cfg, tables, hot_on_device=False, one_home=False, remaps=False,
                             tables_on="device")  # fmt: skip

    def bytes_per_sample(self, candidate, coverage) -> float | None:
        return 0.0  # nothing crosses

    def build(self, cfg, tables, train_source, device):
        from dlrm.placement.run_plan import PlacedEmbeddings
        from embeddings import FusedEmbeddingBagCollection
        from embeddings.row_init import hashed_init_

        opt = cfg.training.sparse_optimizer()
        coll = FusedEmbeddingBagCollection(tables, opt, device=device,
                                           backend=cfg.arch.embedding_backend,
                                           seed=cfg.training.seed)  # fmt: skip
        if cfg.placing.embedding_init == "hashed":  # the tiered placement's initial values
            hashed_init_(coll.table_weights(), cfg.training.seed)
            coll.after_tables_written()
        return PlacedEmbeddings(coll, self.name)

    def predict(self, costs, cfg, candidate, sample):
        return costs.captured(cfg, sample, self.name)


class Host(_Kind):
    name = "host"
    help = ("every table in host memory; pooled embeddings go to the device and their gradients "
            "come back (the CPU-GPU hybrid baseline)")  # fmt: skip
    preference = 4

    def build(self, cfg, tables, train_source, device):
        from dlrm.placement.run_plan import PlacedEmbeddings
        from embeddings.fae import FAEEmbeddingBagCollection

        coll = FAEEmbeddingBagCollection(tables, cfg.training.sparse_optimizer(), None, device,
                                         cfg.arch.embedding_backend, cfg.training.seed)  # fmt: skip
        return PlacedEmbeddings(coll, self.name)

    def bytes_per_sample(self, candidate, coverage) -> float | None:
        return coverage.plain

    def predict(self, costs, cfg, candidate, sample):
        p = costs.captured(cfg, sample, self.name)
        ms, moved = costs.link(cfg, sample)
        if moved:
            p.parts.link = ms
            p.detail["link_bytes"] = moved
            p.ms_per_step = p.parts.total()
        return p


class _HotKind(_Kind):
    """Tuned by a hot budget: proposed at the profile's hot budgets that suit it."""

    tuned_by = ("hot_budget",)

    def bytes_per_sample(self, candidate, coverage) -> float | None:
        return coverage.staged(candidate.hot_budget)

    def candidates(self, space) -> list:
        from dlrm.placement.candidates import Candidate

        return [Candidate(self.name, hot) for hot in space.hot_sizes(self.name)]


class Fae(_HotKind):
    name = "fae"
    help = ("the hot rows replicated on the device; mini-batches whose lookups are all hot train "
            "there, the others on the host tier (FAE, docs/placement.md)")  # fmt: skip
    preference = 1
    multi_process = "hot_replicated"
    regroups_batches = True

    def memory_needs(self, cfg, tables):
        return _layout_needs(cfg, tables, hot_on_device=True, one_home=False, remaps=True)

    def build(self, cfg, tables, train_source, device):
        from dlrm.placement.run_plan import PlacedEmbeddings, PlanFiles, obtain_plan
        from embeddings.fae import FAEEmbeddingBagCollection

        opt = cfg.training.sparse_optimizer()
        plan = obtain_plan(cfg.placing, PlanFiles.of(cfg), tables, opt, train_source)
        coll = FAEEmbeddingBagCollection(tables, opt, plan, device, cfg.arch.embedding_backend,
                                         cfg.training.seed)  # fmt: skip
        return PlacedEmbeddings(coll, self.name, plan)

    def bytes_per_sample(self, candidate, coverage) -> float | None:
        return coverage.replicated(candidate.hot_budget)

    def training_data(self, cfg, data, placed, per_epoch: int):
        """The training split regrouped into hot and cold mini-batches (FAE's schedule)."""
        import dataclasses

        from dlrm.pipelines.fae_batches import FAEBatchSource
        from embeddings.hot_inputs import AllHotClassifier

        if placed.plan is None or not placed.plan.num_hot:
            return data
        train = FAEBatchSource(data.train, AllHotClassifier(placed.plan), cfg.fae.switch_period,
                               cfg.fae.order, per_epoch)  # fmt: skip
        return dataclasses.replace(data, train=train)

    def predict(self, costs, cfg, candidate, sample):
        return costs.captured(cfg, sample, self.name)


class Hotline(_HotKind):
    name = "hotline"
    help = ("the hot rows on the device, every other row in host memory; each mini-batch's "
            "cold rows are staged onto the device ahead of its step (docs/hotline.md)")  # fmt: skip
    preference = 2
    multi_process = "hot_replicated"
    one_home = True

    def memory_needs(self, cfg, tables):
        return _layout_needs(cfg, tables, hot_on_device=True, one_home=True, remaps=False)

    def build(self, cfg, tables, train_source, device):
        from dlrm.placement.run_plan import PlacedEmbeddings, hotline_plan
        from embeddings.staged.hotline import hotline_collection

        opt = cfg.training.sparse_optimizer()
        plan = hotline_plan(cfg, tables, opt, train_source)
        coll = hotline_collection(tables, opt, plan, device, cfg.arch.embedding_backend,
                                  cfg.training.seed)  # fmt: skip
        return PlacedEmbeddings(coll, self.name, plan)

    def predict(self, costs, cfg, candidate, sample):
        return costs.staged(cfg, candidate, sample, "host")


class Tiered(_HotKind):
    name = "tiered"
    help = ("the hot rows on the device, every other row in a file on SSD behind a DRAM row "
            "cache, staged as hotline's (docs/scm.md)")  # fmt: skip
    tuned_by = ("hot_budget", "scm_cache")
    preference = 3
    one_home = True
    initial_rows = ("hashed",)

    def check(self, cfg) -> None:
        if cfg.placing.embedding_init == "uniform":
            raise ConfigError(
                "--embedding-init uniform: --placement tiered initialises every row as a "
                "pure function of seed, table and row (hashed), so untouched rows need no storage"
            )
        if cfg.hotline.learn_batches:
            raise ConfigError(
                "--hotline-learn-batches: not with --placement tiered (its plan is fixed)"
            )

    def settings(self, candidate, cfg) -> dict[str, Any]:
        if cfg.scm.directory:
            return {}
        from dlrm.placement.tiered_setup import scm_directory

        return {"scm_dir": scm_directory(cfg.scm, cfg.run_dir)}  # its files under the run's

    def memory_needs(self, cfg, tables):
        from dlrm.placement.tiered_setup import tiered_needs
        from embeddings.hot_rows import row_bytes

        opt = cfg.training.sparse_optimizer()
        total = sum(t.num_embeddings * row_bytes(t.embedding_dim, opt) for t in tables)
        return tiered_needs(cfg, tables, opt, min(cfg.placing.hot_budget.bytes, total))

    def build(self, cfg, tables, train_source, device):
        from dlrm.placement.tiered_setup import build_tiered

        return build_tiered(cfg, tables, cfg.training.sparse_optimizer(), train_source, device)

    def candidates(self, space) -> list:
        from dlrm.placement.candidates import Candidate

        if len({t.embedding_dim for t in space.tables}) != 1:
            return []  # the SSD tier stores rows of one width
        return [Candidate(self.name, hot, cache)
                for hot in space.hot_sizes(self.name, space.SMALLEST)
                for cache in reversed(space.caches(self.name, hot))]  # fmt: skip

    def predict(self, costs, cfg, candidate, sample):
        return costs.staged(cfg, candidate, sample, "disk")


DEVICE, HOST, FAE, HOTLINE, TIERED = Device(), Host(), Fae(), Hotline(), Tiered()
