"""A run's placement decision as a file: `placement_decision.json` in the run directory, written
when `--placement auto` decides (dlrm/placement/auto.py) and read back by a resumed run, which
continues with the decision it was trained with instead of planning anew."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from dlrm.config import TrainConfig
from dlrm.data import DataSplits
from dlrm.errors import ConfigError

if TYPE_CHECKING:
    from dlrm.placement.auto import Decision

DECISION_NAME = "placement_decision.json"


def write(path: Path, decision: Decision) -> dict:
    """`decision` written to `path` (atomically); the JSON written."""
    from hybrid_dlrm.common.atomic import write_json

    written = decision.to_json()
    write_json(path, written)
    return written


def read(path: Path, flag: str = "--resume") -> dict:
    """The JSON of the decision file at `path`; one ConfigError line when it is not JSON."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag}: {path}: not readable JSON ({e})") from None


def resumed_decision(cfg: TrainConfig, data: DataSplits) -> Decision | None:
    """On `--resume`: the decision of the run it continues; for a run from before the planner
    (a checkpoint and no decision), the rule it was made with: device when every table fits
    `--hot-budget`, else fae. None: plan (a fresh run, or one stopped before any checkpoint)."""
    from dlrm.placement.auto import Decision
    from dlrm.placement.candidates import Candidate
    from dlrm.placement.memory_check import run_tables

    if not cfg.run.resume:
        return None
    from dlrm.run_checks import holds_a_run, resume_source_dir

    source = resume_source_dir(cfg) or cfg.run_dir
    for where in dict.fromkeys((source, cfg.run_dir)):
        path = where / DECISION_NAME
        if path.is_file():
            decision = Decision.from_json(read(path), str(path))
            decision.how = f"reused from {path} (--resume)"
            return decision
    if not holds_a_run(source):
        return None
    from dlrm.placement.build_collection import resolve_placement

    kind = resolve_placement(cfg.placing, run_tables(cfg, data), cfg.training.sparse_optimizer())
    budget = cfg.placing.hot_budget.bytes if kind != "device" else 0
    how = "resumed a run from before the planner: device if every table fits --hot-budget, else fae"
    return Decision(Candidate(kind, budget), how, [], {})
