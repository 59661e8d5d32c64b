"""The access profile and the placement plan a run uses: made from a sample of its training
batches, or reused (`--profile-file`, `--placement-plan`, the run directory's on `--resume`),
and written to the run directory; Hotline's plan learned online; the rows Slipstream tracks.
The collections built from a plan are dlrm/placement/build_collection.py's and dlrm/placement/tiered_setup.py's."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from dlrm.config import TrainConfig
from dlrm.errors import ConfigError
from dlrm.settings.placement import PlacementConfig
from embeddings import SparseOptimizer, TableSpec
from embeddings.collection import EmbeddingCollection
from embeddings.errors import PlacementError, ProfileError
from embeddings.hot_rows import PlacementPlan, plan_placement
from embeddings.profile import AccessProfile, AccessProfiler
from embeddings.staged.collection import StagedEmbeddingBagCollection

log = logging.getLogger(__name__)

PROFILE_NAME = "access_profile.npz"
PLAN_NAME = "placement_plan.npz"


@dataclass
class PlacedEmbeddings:
    """The collection `--placement` built, the placement it resolved to, and its plan (if any)."""

    collection: EmbeddingCollection
    kind: str
    plan: PlacementPlan | None = None


def tracked_plan(cfg: TrainConfig, placed: PlacedEmbeddings | None, train_source) -> PlacementPlan:
    """The rows Slipstream tracks: the placement plan's hot rows; for placements without a plan
    (`device`, `host`), the rows a profile ranks first within `--hot-budget` (the same plan
    FAE would make, written to the run directory and reused on resume)."""
    if placed is None:
        raise ConfigError(
            "--slipstream: needs the trainer to build the embeddings (no model given)"
        )
    if placed.plan is not None:
        return placed.plan
    coll, opt = placed.collection, cfg.training.sparse_optimizer()
    try:
        return obtain_plan(cfg.placing, PlanFiles.of(cfg), coll.tables, opt, train_source)
    except (PlacementError, ProfileError) as e:
        raise ConfigError(str(e)) from None


def hotline_plan(
    cfg: TrainConfig, tables: list[TableSpec], opt: SparseOptimizer, train_source
) -> PlacementPlan | None:
    """Hotline's one-home plan, or None while it is to be learned online (a resumed run that
    learned it already reuses the run directory's)."""
    if cfg.hotline.learn_batches and not (cfg.run.resume and (cfg.run_dir / PLAN_NAME).is_file()):
        return None
    return obtain_plan(cfg.placing, PlanFiles.of(cfg), tables, opt, train_source, one_home=True)


def learned_plan(
    placing: PlacementConfig, run_dir: Path, coll: StagedEmbeddingBagCollection
) -> PlacementPlan:
    """The plan of the accesses Hotline counted online, under `--hot-budget`; written to the run
    directory (a resumed run starts from it)."""
    names = [t.feature_name for t in coll.tables]
    profile = AccessProfile(names, coll.sizes, coll.learned_counts(), coll.stats.train_inputs)
    plan = plan_placement(
        profile, coll.dims, coll.optimizer, placing.hot_budget.bytes, one_home=True
    )
    plan.report["learned_batches"] = coll.learned_batches
    offline = _offline_plan(placing, run_dir, coll)
    if offline is not None:
        plan.report["offline_overlap"] = plan.overlap(offline)
    plan.save(run_dir / PLAN_NAME)
    log.info(
        "hotline: learned %d hot rows over %d mini-batches", plan.num_hot, coll.learned_batches
    )
    if offline is not None:
        log.info(
            "hotline: %d of the offline plan's %d hot rows are in the learned hot set (%.1f%%)",
            plan.report["offline_overlap"]["common_hot_rows"], offline.num_hot,
            100 * (plan.report["offline_overlap"]["share_of_other"] or 0.0),
        )  # fmt: skip
    return plan


def _offline_plan(
    placing: PlacementConfig, run_dir: Path, coll: StagedEmbeddingBagCollection
) -> PlacementPlan | None:
    """The plan an existing `--placement-plan` or `--profile-file` gives under the same budget
    (what the learned hot set is compared with), or None."""
    given = Path(placing.placement_plan).with_suffix(".npz") if placing.placement_plan else None
    if given is not None and given.is_file():
        return PlacementPlan.load(given)
    if placing.profile_file and Path(placing.profile_file).is_file():
        names = [t.feature_name for t in coll.tables]
        profile = obtain_profile(placing, run_dir, names, coll.sizes, None)
        return plan_placement(
            profile, coll.dims, coll.optimizer, placing.hot_budget.bytes, one_home=True
        )
    return None


@dataclass(frozen=True)
class PlanFiles:
    """Where a run keeps its profile and plan, and whether it reuses the plan found there."""

    run_dir: Path
    resume: bool

    @classmethod
    def of(cls, cfg: TrainConfig) -> PlanFiles:
        return cls(cfg.run_dir, bool(cfg.run.resume))


def obtain_plan(
    placing: PlacementConfig,
    files: PlanFiles,
    tables: list[TableSpec],
    opt: SparseOptimizer,
    train_source,
    one_home: bool = False,
) -> PlacementPlan:
    names = [t.feature_name for t in tables]
    sizes = [t.num_embeddings for t in tables]
    dims = [t.embedding_dim for t in tables]
    run_plan = files.run_dir / PLAN_NAME
    given = Path(placing.placement_plan).with_suffix(".npz") if placing.placement_plan else None
    given_profile = bool(placing.profile_file) and Path(placing.profile_file).is_file()
    if given is not None and given.is_file():
        plan, source = PlacementPlan.load(given), f"--placement-plan {given}"
    elif files.resume and run_plan.is_file():
        plan, source = PlacementPlan.load(run_plan), str(run_plan)
    else:
        profile = obtain_profile(placing, files.run_dir, names, sizes, train_source)
        plan = plan_placement(profile, dims, opt, placing.hot_budget.bytes, one_home=one_home)
        source = None
        if given is not None:
            plan.save(given)
    plan.check_fits(names, sizes, dims, opt.kind, source or "placement plan")
    plan.save(run_plan)
    # what the summary says the plan came from (a reused file is otherwise invisible); after the
    # save, so that a resume rewrites the run's plan byte for byte
    plan.report["source"] = (
        f"reused {source}" if source
        else f"made from --profile-file {placing.profile_file}" if given_profile
        else "made from a profile of the training data"
    )  # fmt: skip
    r = plan.report
    log.info(
        "%s placement: %d hot rows (%.1f MB), in-sample hot lookups %.3f, hot inputs %.3f",
        placing.placement, plan.num_hot, plan.device_bytes() / 2**20, r.get("hot_lookup_share") or 0.0, r.get("hot_input_share") or 0.0,
    )  # fmt: skip
    return plan


def obtain_profile(
    placing: PlacementConfig, run_dir: Path, names: list[str], sizes: list[int], train_source
) -> AccessProfile:
    given = Path(placing.profile_file) if placing.profile_file else None
    if given is not None and given.is_file():
        profile = AccessProfile.load(given)
        if profile.feature_names != names or profile.table_sizes != sizes:
            raise ProfileError(f"--profile-file {given}: made for other tables than this model's")
        return profile
    profile = profile_training_sample(train_source, names, sizes, placing.profile_sample_rate)
    profile.save(given if given is not None else run_dir / PROFILE_NAME)
    return profile


def profile_training_sample(
    source, names: list[str], sizes: list[int], rate: float
) -> AccessProfile:
    """Counts over `rate` of the epoch-0 training batches, evenly spread over the epoch."""
    n = len(source)
    batches = profiled_batches(n, rate)
    profiler = AccessProfiler(sizes, names)
    for j in batches:
        profiler.add_kjt(source.batch(0, j).sparse_features)
    return profiler.finish(sample_rate=len(batches) / n)


def profiled_batches(n: int, rate: float) -> list[int]:
    """The indices of the batches `profile_training_sample` reads of an n-batch epoch."""
    k = min(n, max(1, math.ceil(rate * n)))
    return [(j * n) // k for j in range(k)]
