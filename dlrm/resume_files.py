"""The files besides a checkpoint that steer a resumed run, as every checkpoint records them and
`--resume` checks them: a resumed run trusts a file only when it agrees with the checkpoint.

- `placement_decision.json` (`--placement auto`'s choice): the checkpoint keeps its JSON, checked
  before the placement is applied (dlrm/placement/decision_file.py);
- the access profile and the placement plan: the checkpoint keeps what they held, checked once the
  collection is built from them and before the first step (dlrm/placement/plan_files.py);
- `config.json`: every checkpoint carries the run's settings whole; dlrm/run_checks.py checks the
  file against them (`check_settings_file`) and this run's settings (`check_resume_settings`).

A difference is one line naming the file, the field and both values, each on its side (the
file's, the checkpoint's), and exit code 2 from the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlrm.checkpoints.store import RESUME_FILES
from dlrm.placement import decision_file, plan_files
from dlrm.settings.placement import PlacementConfig


@dataclass
class ResumeFiles:
    """This run's: its run directory, its placement settings as applied (None: an injected
    model, whose placement is its own) and its decision's JSON (None: not `--placement auto`)."""

    run_dir: Path
    placing: PlacementConfig | None = None
    decision: dict | None = None

    def record(self) -> dict:
        """What a checkpoint written now records."""
        out: dict = {}
        if self.decision is not None:
            out[decision_file.RECORD] = self.decision
        if self.placing is not None:
            out.update(plan_files.record(self.run_dir, self.placing))
        return out

    def check(self, checkpoint: dict) -> None:
        """The profile and plan this run was built from are those `checkpoint` was trained with
        (the decision was checked before it was applied); ConfigError otherwise."""
        recorded = checkpoint.get(RESUME_FILES) or {}
        if self.placing is not None and recorded:
            step = int(checkpoint["train_state"]["step"])
            plan_files.check(recorded, self.run_dir, self.placing, step)
