"""A run's placement decision as a file: `placement_decision.json` in the run directory, written
when `--placement auto` decides (dlrm/placement/auto.py) and read back by a resumed run, which
continues with the decision it was trained with instead of planning anew.

The file is for people and tools; what a resumed run trusts is the checkpoint. Every checkpoint
of an auto run records the decision's JSON as the file held it (`RECORD`, verified by the
checkpoint's checksums), and on `--resume` the file must hold exactly that: an edited field (the
placement, a hot budget, a row cache, a prediction the placement check compares with) is one
line naming the file, the field and both values, each on its side, before anything is built.
A missing file is written again from the checkpoint. A checkpoint written before checkpoints
recorded the decision takes the file as it is, with one warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlrm.checkpoints.store import RESUME_FILES
from dlrm.config import TrainConfig
from dlrm.data import DataSplits
from dlrm.errors import ConfigError
from dlrm.placement.candidates import Candidate

log = logging.getLogger(__name__)

DECISION_NAME = "placement_decision.json"
RECORD = "placement_decision"  # its key in a checkpoint's RESUME_FILES (dlrm/resume_files.py)
SETTINGS = "settings"  # the part of the file that is the run's settings (placement, budgets)

# `--resume`'s checkpoint, read in the background (dlrm/compose.py): (path, contents) or None
Checkpoint = Callable[[], "tuple[Path, dict] | None"]


def write(path: Path, record: dict) -> None:
    """The decision's JSON (dlrm/placement/auto.py's `Decision.to_json()`, or a checkpoint's
    record) written to `path`."""
    from hybrid_dlrm.common.atomic import write_json

    write_json(path, record)


def read(path: Path, flag: str = "--resume") -> dict:
    """The JSON of the decision file at `path`; one ConfigError line when it is not JSON."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag}: {path}: not readable JSON ({e})") from None


def resumed(cfg: TrainConfig, checkpoint: Checkpoint | None = None) -> tuple[dict, str] | None:
    """On `--resume`: the JSON of the decision the run continues with, and how it was found
    (what the printed table says); the run directory's file holds it afterwards. From the
    checkpoint's record where it has one, the file checked against it (a missing file written
    again); else, for a checkpoint written before checkpoints recorded it, the file as it is.
    None: no decision to continue (see `rule_before_the_planner`)."""
    from dlrm.run_checks import resume_source_dir

    if not cfg.run.resume:
        return None
    source = resume_source_dir(cfg) or cfg.run_dir
    target = cfg.run_dir / DECISION_NAME
    found = next(
        (p for w in dict.fromkeys((source, cfg.run_dir)) if (p := w / DECISION_NAME).is_file()),
        None,
    )
    ckpt = checkpoint() if checkpoint is not None else None
    files = ckpt[1].get(RESUME_FILES) if ckpt is not None else None  # None: an older checkpoint
    record = files.get(RECORD) if files else None
    if record is not None:
        step = ckpt[1]["train_state"]["step"]
        if found is not None:
            check(read(found), record, found, step)
            how = f"reused from {found} (--resume)"
        else:
            how = f"the checkpoint's at step {step}, written again to {target} (--resume)"
    elif found is not None:
        if ckpt is not None and files is None:
            log.warning(
                "--resume: %s records no placement decision (written before checkpoints did): "
                "%s is taken as it is",
                ckpt[0], found,
            )  # fmt: skip
        record, how = read(found), f"reused from {found} (--resume)"
    else:
        return None
    if found != target:
        write(target, record)
    return record, how


def rule_before_the_planner(cfg: TrainConfig, data: DataSplits) -> Candidate | None:
    """On `--resume` of a run from before the planner (a checkpoint and no decision): the
    placement it was made with, device when every table fits `--hot-budget`, else fae. None: a
    fresh run, to plan."""
    from dlrm.placement.build_collection import resolve_placement
    from dlrm.placement.memory_check import run_tables
    from dlrm.run_checks import holds_a_run, resume_source_dir

    if not cfg.run.resume or not holds_a_run(resume_source_dir(cfg) or cfg.run_dir):
        return None
    kind = resolve_placement(cfg.placing, run_tables(cfg, data), cfg.training.sparse_optimizer())
    return Candidate(kind, cfg.placing.hot_budget.bytes if kind != "device" else 0)


RULE_BEFORE_THE_PLANNER = (
    "resumed a run from before the planner: device if every table fits --hot-budget, else fae"
)


# --- the check against the checkpoint -------------------------------------------------------------

_ABSENT = object()


def check(found: dict, record: dict, path: Path, step: int) -> None:
    """`found` (the file's JSON) is `record` (the checkpoint's), or one ConfigError line naming
    the first field that differs, the file's value and the checkpoint's."""
    diff = _first_difference(found, record, ())
    if diff is None:
        return
    where, mine, theirs = diff
    settings = len(where) == 2 and where[0] == SETTINGS
    name = where[1] if settings else _field_name(where)
    verb = "was trained with" if settings else "recorded"
    raise ConfigError(
        f"--resume: {path}: {name} is {_shown(mine)} but the checkpoint at step {step} {verb} "
        f"{_shown(theirs)}; put the checkpoint's value back (or delete the file: the "
        "checkpoint's decision is written again), or start a new run"
    )


def _first_difference(a: Any, b: Any, where: tuple) -> tuple[tuple, Any, Any] | None:
    """The path of the first place `a` and `b` differ (settings first: the fields that change
    what is trained), with their values there; None when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = list(dict.fromkeys([*b, *a]))
        keys.sort(key=lambda k: k != SETTINGS)  # stable: otherwise the checkpoint's order
        for k in keys:
            d = _first_difference(a.get(k, _ABSENT), b.get(k, _ABSENT), (*where, k))
            if d is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else _ABSENT
            y = b[i] if i < len(b) else _ABSENT
            d = _first_difference(x, y, (*where, i))
            if d is not None:
                return d
        return None
    # 1 and 1.0 and True are different values in a file: compare their JSON
    return None if json.dumps(a, default=str) == json.dumps(b, default=str) else (where, a, b)


def _field_name(where: tuple) -> str:
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the file"


def _shown(value: Any, width: int = 80) -> str:
    if value is _ABSENT:
        return "absent"
    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= width else text[: width - 3] + "..."
