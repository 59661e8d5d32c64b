"""`--placement tiered`: the plan, the SSD tier's settings and the collection (embeddings/tiered.py).

The plan is Hotline's one-home plan under `--hot-budget` (rows ranked by profile counts per
byte fill the device tier; with `--device cpu` that tier is the in-memory tables); every other
row's home is the SSD tier in `--scm-dir` (default `<out-dir>/scm`), behind a row cache of
`--scm-cache` bytes whose priorities are the same profile's counts. A resumed run keeps the
tier's files for the checkpoint to roll back to; a new run starts them afresh (a directory
holding another run's tier is refused).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dlrm.config import TrainConfig
from dlrm.embedding_setup import PLAN_NAME, PROFILE_NAME, PlacedEmbeddings, obtain_plan
from dlrm.errors import ConfigError
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.errors import PlacementError, ProfileError, ScmError
from embeddings.placement import parse_bytes
from embeddings.profile import AccessProfile
from embeddings.tiered import ScmSettings, profile_priority, tiered_collection

log = logging.getLogger(__name__)


def scm_settings(cfg: TrainConfig) -> ScmSettings:
    return ScmSettings(
        directory=cfg.scm_dir or str(cfg.run_dir / "scm"),
        cache_bytes=parse_bytes(cfg.scm_cache, "--scm-cache"),
        io=cfg.scm_io,
        io_threads=cfg.scm_io_threads,
        io_engine=cfg.scm_io_engine,
        io_depth=cfg.scm_io_depth,
        resume=bool(cfg.resume),
        owner=str(cfg.run_dir),
    )


def _profile_counts(cfg: TrainConfig):
    """The access profile the plan came from, if one was written or given."""
    for path in (cfg.profile_file, cfg.run_dir / PROFILE_NAME):
        if path and Path(path).is_file():
            return AccessProfile.load(Path(path)).counts
    return None


def build_tiered(
    cfg: TrainConfig, tables: list[TableSpec], opt: SparseOptimizer, train_source, device
) -> PlacedEmbeddings:
    try:
        plan = obtain_plan(cfg, tables, opt, train_source, one_home=True)
        counts = _profile_counts(cfg)
        sizes = [t.num_embeddings for t in tables]
        priority = profile_priority(counts, sizes) if counts is not None else None
        del counts  # dense per-row counts (1 GB at Terabyte scale): the priority keeps seen rows
        coll = tiered_collection(
            tables, opt, plan, scm_settings(cfg), torch.device(device), cfg.embedding_backend,
            cfg.seed, priority, staging_rows=max(cfg.mini_batch_size, cfg.test_mini_batch_size),
        )  # fmt: skip
    except (PlacementError, ProfileError, ScmError) as e:
        raise ConfigError(str(e)) from None
    except ValueError as e:  # e.g. tables of different widths
        raise ConfigError(f"--placement tiered: {e}") from None
    coll.plan.save(cfg.run_dir / PLAN_NAME)  # with its second tier named ssd
    log.info("tiered placement: %d hot rows, %s", coll.num_hot, coll.store.describe())
    return PlacedEmbeddings(coll, "tiered", coll.plan)
