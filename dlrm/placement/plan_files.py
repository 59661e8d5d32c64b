"""The access profile and placement plan files a run's placement was built from, as every
checkpoint records them and `--resume` checks them.

A profile or a plan is a file a user may read, plot, replace and reuse (`--profile-file`,
`--placement-plan`), and a resumed run reuses the run directory's (dlrm/placement/run_plan.py).
Their own checks (zip's CRC-32 of every member, the header, the tables they were made for) catch
damage, not a valid file from another run or another budget put in their place, with which a
resumed run would continue on other hot rows than its checkpoint was trained with. So every
checkpoint records what they held: a CRC-32 over their arrays' names, sizes and CRC-32s as
zip's directory lists them (a rewrite of the same contents, whose zip timestamps differ, is the
same file) and their metadata but a plan's report (how it was made, which a resume rewrites),
and the plan's hot rows and device budget. A resumed run, once its collection is
built and before its first step, checks the files it used against the record: a difference is
one line naming the file, the field and both values. A file the checkpoint did not record
(Hotline's plan, learned after it) is not checked.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from dlrm.errors import ConfigError
from dlrm.placement.run_plan import PLAN_NAME, PROFILE_NAME
from dlrm.settings.placement import PlacementConfig
from hybrid_dlrm.common.crc import crc_hex

KINDS = ("plan", "profile")
WHAT = {"plan": "placement plan", "profile": "access profile"}


def paths(run_dir: Path, placing: PlacementConfig) -> dict[str, Path]:
    """The files this run's placement reads: the plan (`--placement-plan` where it exists, else
    the run directory's copy, which every plan a run uses is saved to) and the profile
    (`--profile-file`, else the run directory's)."""
    given = Path(placing.placement_plan).with_suffix(".npz") if placing.placement_plan else None
    plan = given if given is not None and given.is_file() else run_dir / PLAN_NAME
    profile = Path(placing.profile_file) if placing.profile_file else run_dir / PROFILE_NAME
    return {"plan": plan, "profile": profile}


def identity(path: Path, kind: str) -> dict | None:
    """What the file holds, as a checkpoint records it; None when there is no such file (or it
    is no zip: its own reader says so when the run reads it)."""
    try:
        with zipfile.ZipFile(path) as z:
            arrays = sorted((i.filename, i.file_size, i.CRC) for i in z.infolist()
                            if i.filename != "meta.npy")  # fmt: skip
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None
    if not isinstance(meta, dict):
        return None
    # a plan's report says how it was made ("reused ...", "made from ..."), which a resume
    # changes; its tiers, budgets and rows are what it is
    meta.pop("report", None)
    out: dict = {"crc32": crc_hex(json.dumps([arrays, meta], sort_keys=True).encode())}
    if kind == "plan":
        out["hot_rows"] = int(sum(meta.get("hot_rows") or []))
        out["device_budget"] = meta.get("device_budget")
    return out


def record(run_dir: Path, placing: PlacementConfig) -> dict[str, dict]:
    """The identities of the profile and plan files there are now, by kind."""
    out = {}
    for kind, path in paths(run_dir, placing).items():
        found = identity(path, kind)
        if found is not None:
            out[kind] = found
    return out


def check(recorded: dict, run_dir: Path, placing: PlacementConfig, step: int) -> None:
    """The files this run used hold what the checkpoint at `step` recorded (`recorded`: its
    record by kind), or one ConfigError line naming the file, the field and both values."""
    for kind, path in paths(run_dir, placing).items():
        then = recorded.get(kind)
        now = identity(path, kind) if then is not None else None
        if now is None or now == then:
            continue  # not recorded, or not used by this run (a plan is remade from its profile)
        field = next(k for k in ("hot_rows", "device_budget", "crc32") if now.get(k) != then.get(k))
        if field == "crc32":
            detail = (
                f"its contents (CRC-32 {now[field]}) are not the {WHAT[kind]} the checkpoint at "
                f"step {step} was trained with (CRC-32 {then[field]})"
            )
        else:
            detail = (
                f"{field} is {now[field]} but the checkpoint at step {step} was trained with "
                f"{then.get(field)}"
            )
        raise ConfigError(
            f"--resume: {path}: {detail}; put back the {WHAT[kind]} the run was trained with, or "
            "start a new run"
        )
