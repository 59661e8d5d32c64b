"""`--placement tiered`: the plan, the SSD tier's settings and the collection (embeddings/ssd/collection.py).

The plan is Hotline's one-home plan under `--hot-budget` (rows ranked by profile counts per
byte fill the device tier; with `--device cpu` that tier is the in-memory tables); every other
row's home is the SSD tier in `--scm-dir` (default `<out-dir>/scm`), behind a row cache of
`--scm-cache` bytes whose priorities are the same profile's counts. A resumed run keeps the
tier's files for the checkpoint to roll back to; a new run starts them afresh (a directory
holding another run's tier is refused).

`--scm-cache` larger than the rows the tier holds is capped at them: a cache slot no row can ever
fill is memory allocated for nothing (`--scm-cache 5TB` with 483 KB of tables asked for 5 TB).
What the placement needs per tier (`tiered_needs`) is checked against what this process may use
before the tier is made (dlrm/placement/memory_check.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dlrm.config import TrainConfig
from dlrm.errors import ConfigError
from dlrm.models.kinds import model_kind
from dlrm.placement.run_plan import (
    PLAN_NAME,
    PROFILE_NAME,
    PlacedEmbeddings,
    PlanFiles,
    obtain_plan,
)
from dlrm.settings.placement import ScmConfig
from dlrm.settings.sections import DataConfig, TrainingConfig
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError, ProfileError, ScmError
from embeddings.hot_rows import row_bytes
from embeddings.profile import AccessProfile
from embeddings.room import Needs, fmt_bytes
from embeddings.ssd.cache import RowCache, SlotMap
from embeddings.ssd.collection import ScmSettings, profile_priority, tiered_collection
from embeddings.ssd.file import BLOCK, PAYLOAD
from embeddings.ssd.layout import LAYOUT_BYTES_PER_ROW, RowLayout, layout_rows, plan_layout
from embeddings.ssd.log import BYTES_PER_ROW as LOG_MAP
from embeddings.ssd.log import log_disk_bytes, split_cache

log = logging.getLogger(__name__)


def scm_directory(scm: ScmConfig, run_dir: Path) -> str:
    return scm.directory or str(run_dir / "scm")


def cache_bytes(
    scm: ScmConfig, tables: list[TableSpec], opt: SparseOptimizer, hot_rows: int
) -> int:
    """`--scm-cache`, capped at the bytes of the rows the tier holds (every row but the
    `hot_rows` the device tier holds)."""
    asked = scm.cache.bytes
    rows = sum(t.num_embeddings for t in tables) - hot_rows
    return min(asked, max(0, rows) * row_bytes(tables[0].embedding_dim, opt))


def tiered_needs(
    cfg: TrainConfig, tables: list[TableSpec], opt: SparseOptimizer, hot_bytes: int
) -> Needs:
    """What `--placement tiered` allocates with at most `hot_bytes` of hot rows on the device:
    those and the staging slots there; the row cache (capped) and its bookkeeping, the access
    profile's counts and the tier's block maps in host DRAM; the tier's file on disk (sparse,
    but every block is written once its rows are)."""
    dim, rb = tables[0].embedding_dim, row_bytes(tables[0].embedding_dim, opt)
    rows = sum(t.num_embeddings for t in tables)
    staging = max(cfg.training.mini_batch_size, cfg.training.test_mini_batch_size)
    cache = cache_bytes(cfg.scm, tables, opt, hot_bytes // rb)
    rpb = max(1, PAYLOAD // rb)
    logged = log_rows(cfg.scm, tables, opt, hot_bytes // rb, cache)
    slots = (cache - logged * LOG_MAP) // rb
    blocks = -(-rows // rpb)
    needs = Needs(disk_dir=scm_directory(cfg.scm, cfg.run_dir))
    needs.add("device", "hot rows + optimizer state", hot_bytes, rows=True)
    needs.add("device", "staging slots", len(tables) * staging * rb, rows=True)
    needs.add("host", f"SSD tier row cache (--scm-cache {fmt_bytes(cache)})", cache)
    per_slot = RowCache.BOOKKEEPING_PER_SLOT + SlotMap.BYTES_PER_ENTRY / SlotMap.LOAD
    needs.add("host", "row cache bookkeeping", int(slots * per_slot))
    needs.add("host", "access profile", 4 * rows)
    needs.add("host", "SSD tier block maps", 2 * blocks)
    if cfg.scm.layout == "profile":
        placed = min(rows, layout_rows(cache))
        needs.add(
            "host", "SSD tier row layout (--scm-layout profile)", placed * LAYOUT_BYTES_PER_ROW
        )
    file = f"SSD tier file (--scm-dir, rows of {dim} + state floats)"
    written = written_blocks(cfg, tables, rb) if cfg.scm.overcommit else None
    if written is None or written >= blocks:
        needs.add("disk", file, blocks * BLOCK)
    else:
        needs.add("disk", f"{file}, over-committed: the blocks the run can write", written * BLOCK)
    if logged:
        needs.add("disk", "SSD tier write-back log (--scm-log-share)", log_disk_bytes(logged, rpb))
    return needs


def run_steps(training: TrainingConfig, data: DataConfig) -> int | None:
    """The steps a run takes, where the settings say it: `--num-batches` per epoch, or the
    synthetic data's own size; None for a whole epoch of a data set on disk."""
    if training.num_batches:
        return training.nepochs * training.num_batches
    if data.data_set == "synthetic":
        return training.nepochs * -(-data.data_size // training.mini_batch_size)
    return None


def written_blocks(cfg: TrainConfig, tables: list[TableSpec], rb: int) -> int | None:
    """`--scm-overcommit`'s bound on the tier's blocks a run writes: a block is written only
    once one of its rows was looked up in training (evaluation only reads), so table t writes at
    most min(its blocks, steps x samples x ids per bag) of them. Every lookup is counted as if
    it went to the tier (hot rows and repeats make the truth smaller). None: steps unknown."""
    from dlrm.data import bag_sizes

    steps = run_steps(cfg.training, cfg.data)
    if steps is None:
        return None
    rows_per_step = cfg.training.mini_batch_size * model_kind(cfg.arch.model).rows_per_sample(cfg)
    sizes = bag_sizes(cfg.data, len(tables)) or [1] * len(tables)
    per_block = max(1, PAYLOAD // rb)
    return sum(
        min(-(-t.num_embeddings // per_block) + 1, steps * rows_per_step * k)  # +1: a shared edge
        for t, k in zip(tables, sizes)
    )


def log_rows(scm: ScmConfig, tables: list[TableSpec], opt: SparseOptimizer, hot_rows: int,
             cache: int) -> int:  # fmt: skip
    """The write-back log's rows for a tier of every row but `hot_rows`, with `cache` bytes."""
    rb = row_bytes(tables[0].embedding_dim, opt)
    rows = max(0, sum(t.num_embeddings for t in tables) - hot_rows)
    return split_cache(cache, rb, max(1, PAYLOAD // rb), scm.log_share, rows)[1]


def scm_settings(
    scm: ScmConfig, run_dir: Path, resume: bool, cache: int | None = None, log_rows: int = 0
) -> ScmSettings:
    """The SSD tier's settings, of the run in `run_dir` (`resume`: it continues, and keeps the
    tier's files); `cache`: the row cache's bytes (default `--scm-cache`), `log_rows` of them
    the write-back log's."""
    return ScmSettings(
        directory=scm_directory(scm, run_dir),
        cache_bytes=scm.cache.bytes if cache is None else cache,
        io=scm.io,
        io_threads=scm.io_threads,
        io_engine=scm.io_engine,
        io_depth=scm.io_depth,
        log_rows=log_rows,
        resume=resume,
        owner=str(run_dir),
    )


def _profile(profile_file: str | None, run_dir: Path) -> AccessProfile | None:
    """The access profile the plan came from, if one was written or given."""
    for path in (profile_file, run_dir / PROFILE_NAME):
        if path and Path(path).is_file():
            return AccessProfile.load(Path(path))
    return None


def tier_layout(
    scm: ScmConfig, profile: AccessProfile | None, plan, cache: int, levels=None
) -> RowLayout | None:
    """Where a new tier file puts each row: `--scm-layout profile` with a profile, the profile
    layout of the rows the plan leaves to the tier (embeddings/ssd/layout.py), at most
    `layout_rows(cache)` of them; else row-id order (None). `levels`: the profile's
    `count_levels`, where a planner made them once for all its candidates."""
    if scm.layout != "profile" or profile is None:
        return None
    return plan_layout(profile, plan, layout_rows(cache), levels)


def build_tiered(
    cfg: TrainConfig, tables: list[TableSpec], opt: SparseOptimizer, train_source, device
) -> PlacedEmbeddings:
    try:
        files = PlanFiles.of(cfg)
        plan = obtain_plan(cfg.placing, files, tables, opt, train_source, one_home=True)
        profile = _profile(cfg.placing.profile_file, cfg.run_dir)
        sizes = [t.num_embeddings for t in tables]
        priority = profile_priority(profile.counts, sizes) if profile is not None else None
        cache = cache_bytes(cfg.scm, tables, opt, plan.num_hot)
        layout = tier_layout(cfg.scm, profile, plan, cache)
        del profile  # dense per-row counts (1 GB at Terabyte scale): the priority keeps seen rows
        if cache < cfg.scm.cache.bytes:
            log.info(
                "--scm-cache %s: capped at the tier's %s of rows", cfg.scm.cache, fmt_bytes(cache)
            )
        logged = log_rows(cfg.scm, tables, opt, plan.num_hot, cache)
        scm = scm_settings(cfg.scm, cfg.run_dir, bool(cfg.run.resume), cache, logged)
        scm.layout = layout
        coll = tiered_collection(
            tables, opt, plan, scm, torch.device(device), cfg.arch.embedding_backend,
            cfg.training.seed, priority, staging_rows=max(cfg.training.mini_batch_size, cfg.training.test_mini_batch_size),
        )  # fmt: skip
    except (PlacementError, ProfileError, ScmError) as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:  # e.g. tables of different widths
        raise ConfigError(f"--placement tiered: {e}") from None
    coll.plan.save(cfg.run_dir / PLAN_NAME)  # with its second tier named ssd
    log.info("tiered placement: %d hot rows, %s", coll.num_hot, coll.store.describe())
    _say_overcommitted(cfg, tables, opt)
    return PlacedEmbeddings(coll, "tiered", coll.plan)


def _say_overcommitted(cfg: TrainConfig, tables: list[TableSpec], opt: SparseOptimizer) -> None:
    """The start line of an over-committed tier: its file is larger than what the disk was
    checked for."""
    if not cfg.scm.overcommit:
        return
    rb = row_bytes(tables[0].embedding_dim, opt)
    blocks = -(-sum(t.num_embeddings for t in tables) // max(1, PAYLOAD // rb))
    written = written_blocks(cfg, tables, rb)
    if written is None or written >= blocks:
        log.info("--scm-overcommit: the run can write the whole SSD tier file (%s): not over-"
                 "committed", fmt_bytes(blocks * BLOCK))  # fmt: skip
        return
    log.warning(
        "--scm-overcommit: the SSD tier file is over-committed: %s sparse, the disk checked for "
        "the %s its %d steps can write; a disk that fills stops the run at its last checkpoint",
        fmt_bytes(blocks * BLOCK), fmt_bytes(written * BLOCK), run_steps(cfg.training, cfg.data),
    )  # fmt: skip
