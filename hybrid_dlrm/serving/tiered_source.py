"""The full tables of a `--placement tiered` checkpoint, for export.

Such a checkpoint holds the device tier's hot rows and a point (generation, written-block map)
of the run's SSD tier, not the cold rows (embeddings/staged/checkpoint.py): the rows are read
from the tier, rolled back to that point exactly as `--resume` does. The run's own files are
never written: the run's collection is rebuilt from its config.json over a scratch directory
holding copies of the tier's description and journal (the files a restore rewrites) and the
tier's rows.dat by symbolic link, or by copy when the journal holds blocks to roll back (a run
stopped after its checkpoint). The run and its tier are locked while they are read, so a run in
use by another process is refused.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from dlrm.config import TrainConfig
from dlrm.errors import CheckpointError, ConfigError
from dlrm.placement.run_plan import PLAN_NAME, PROFILE_NAME
from embeddings.errors import ScmError
from embeddings.ssd.journal import UndoJournal
from embeddings.ssd.layout import LAYOUT_FILE
from embeddings.ssd.tier import JOURNAL, MANIFEST, ROWS
from hybrid_dlrm.common.lock import DirectoryLock, LockError

TIERED_KEY = "tiered.hot_gids"


def is_tiered(state: dict, prefix: str) -> bool:
    return f"{prefix}{TIERED_KEY}" in state


def _run_dir(path: Path) -> Path:
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def tiered_tables(path: Path, data: dict, prefix: str) -> dict[str, torch.Tensor]:
    """`{prefix}<table>.weight` for every table of the tiered checkpoint at `path` (`data`: its
    verified contents). A CheckpointError of one line when the run is in use or its tier's files
    are missing or damaged."""
    if "config" not in data:
        raise CheckpointError(f"{path}: a tiered checkpoint without its run's settings")
    run = _run_dir(path)
    config = dict(data["config"])
    scm = Path(config.get("scm_dir") or run / "scm")
    locks = []
    try:
        for where, flag in ((run, "run directory"), (scm, "--scm-dir")):
            locks.append(DirectoryLock(where).acquire(f"{flag} {where}"))
        with tempfile.TemporaryDirectory(prefix="quantize-tier-") as scratch:
            try:
                return _read_tables(path, data, prefix, run, scm, config, Path(scratch))
            except (ScmError, ConfigError) as e:  # naming the run's files, not the copies
                why = str(e).replace(str(Path(scratch) / "scm"), str(scm))
                raise CheckpointError(f"{path}: its SSD tier cannot be read: {why}") from None
    except LockError as e:
        raise CheckpointError(f"{path}: {e}") from None
    finally:
        for lock in reversed(locks):
            lock.release()


def _read_tables(path, data, prefix, run, scm, config, scratch: Path) -> dict[str, torch.Tensor]:
    from dlrm.build import table_sizes
    from dlrm.data import build_data
    from dlrm.placement.tiered_setup import build_tiered
    from embeddings import tables_for_features

    for name in (MANIFEST, JOURNAL, ROWS):
        if not (scm / name).is_file():
            raise CheckpointError(f"{scm / name}: the run's SSD tier file is missing")
    state = data["model"]
    generation = int(state[f"{prefix}tiered.scm_generation"])
    blocks, _ = UndoJournal(scm / JOURNAL).rollback_images(generation)
    copy = scratch / "scm"
    copy.mkdir()
    for name in (MANIFEST, JOURNAL):
        shutil.copyfile(scm / name, copy / name)
    if (scm / LAYOUT_FILE).is_file():  # where rows.dat keeps each row (verified when opened)
        shutil.copyfile(scm / LAYOUT_FILE, copy / LAYOUT_FILE)
    if blocks.size:  # the restore writes pre-images into rows.dat: into a copy of it
        shutil.copyfile(scm / ROWS, copy / ROWS)
    else:  # the rows are read only
        (copy / ROWS).symlink_to((scm / ROWS).resolve())
    plan = config.get("placement_plan") or str(run / PLAN_NAME)
    profile = config.get("profile_file") or (
        str(run / PROFILE_NAME) if (run / PROFILE_NAME).is_file() else None
    )
    if not Path(plan).with_suffix(".npz").is_file():
        raise CheckpointError(
            f"{Path(plan).with_suffix('.npz')}: the run's placement plan is missing"
        )
    cfg = TrainConfig.from_json(
        {**config, "out_dir": str(scratch / "run"), "scm_dir": str(copy), "resume": str(path),
         "placement_plan": plan, "profile_file": profile, "device": "cpu"}
    )  # fmt: skip
    splits = build_data(cfg)
    tables = tables_for_features(
        table_sizes(cfg, splits), cfg.arch.sparse_feature_size, splits.feature_names
    )
    opt = cfg.training.sparse_optimizer()
    coll = build_tiered(cfg, tables, opt, splits.train, torch.device("cpu")).collection
    try:
        mine = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        try:
            coll.load_state_dict(mine)
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            raise CheckpointError(
                f"{path}: its tiered state does not fit the run ({first[-1]})"
            ) from None
        weights = [w.detach().cpu().clone() for w in coll.table_weights()]
    finally:
        coll.store.tier.close()
    return {f"{prefix}{t.name}.weight": w for t, w in zip(tables, weights)}
