"""The files of a run directory the trainer writes as it goes: `config.json`, `metrics.jsonl`
(one JSON object per event) and `summary.json`, and the `--save-model` file. Rank 0 writes them
for the whole run; every other rank gets `NoRunFiles`, whose writes do nothing, so the trainer
never asks which rank it is (the composition root, dlrm/compose.py, picks).

With `--tensorboard` (auto: where TensorBoard is installed) every numeric field of an event is
also a scalar of TensorBoard's event files in `RUN/tensorboard/` (`train/loss`, `eval/test_auc`,
...): `tensorboard --logdir RUN` reads the run as it trains. TensorBoard is never required."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dlrm import run_checks
from dlrm.checkpoints import format as ckpt
from dlrm.config import TrainConfig
from dlrm.errors import ConfigError
from hybrid_dlrm.common.atomic import write_text

# a TensorBoard writer for a directory: `add_scalar(tag, value, step)`, `flush()`
BoardFactory = Callable[[Path], Any]


def tensorboard_writer(setting: bool | None) -> BoardFactory | None:
    """`--tensorboard`: false, none; auto (None), torch's SummaryWriter where TensorBoard is
    installed; true, that or a one-line error."""
    if setting is False:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        if setting:
            raise ConfigError(
                "--tensorboard: TensorBoard is not installed (pip install tensorboard), or say "
                "--tensorboard=false"
            ) from None
        return None
    return lambda directory: SummaryWriter(str(directory))


class RunFiles:
    def __init__(self, path: Path, board: BoardFactory | None = None) -> None:
        self.path = path
        self._make_board, self._board = board, None

    def open(self, cfg: TrainConfig, changed: dict) -> None:
        """The directory, and its config.json unless a resumed run keeps it unchanged."""
        self.path.mkdir(parents=True, exist_ok=True)
        kept = cfg.run.resume and run_checks.read_run_settings(self.path, warn=False)
        if not kept or changed:
            (self.path / "config.json").write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
        if self._make_board is not None:
            self._board = self._make_board(self.path / "tensorboard")

    def drop_events_after(self, step: int) -> int:
        """metrics.jsonl reads as one run: the events a killed run logged after the checkpoint
        this run resumes from are dropped (they are computed again); returns how many."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return 0
        lines = path.read_text().splitlines()
        keep = []
        for line in lines:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if e.get("step", 0) <= step:
                keep.append(line)
        if len(keep) != len(lines):
            write_text(path, "".join(x + "\n" for x in keep))
        return len(lines) - len(keep)

    def logged(self, event: str) -> bool:
        """Whether metrics.jsonl holds an `event` event (a resumed run's: those up to its
        checkpoint, once `drop_events_after` has dropped the rest)."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return False
        for line in path.read_text(errors="replace").splitlines():
            try:
                if json.loads(line).get("event") == event:
                    return True
            except (ValueError, AttributeError):  # a line cut by a kill
                continue
        return False

    def event(self, record: dict) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._board is not None:
            kind, step = record.get("event", "event"), record.get("step", 0)
            for key, value in record.items():
                if key not in ("step", "epoch") and isinstance(value, int | float):
                    if not isinstance(value, bool):
                        self._board.add_scalar(f"{kind}/{key}", value, step)

    def summary(self, summary: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if self._board is not None:
            self._board.flush()

    def model_file(self, path: Path, model: torch.nn.Module, arch: dict, state: dict) -> None:
        """Weights only (`state`: the model's state dict, taken on every rank: with sharded
        tables that is a collective)."""
        ckpt.save_model_file(path, model, arch, state)


def read_summary(run: Path, step: int) -> dict | None:
    """`run`'s summary.json if it reports a run that ended at `step`, else None (read by every
    rank: whether a resumed run has anything left to do is decided alike everywhere)."""
    try:
        summary = json.loads((run / "summary.json").read_bytes())
    except (OSError, ValueError):
        return None
    ok = isinstance(summary, dict) and summary.get("steps") == step and summary.get("stop_reason")
    return summary if ok else None


class NoRunFiles(RunFiles):
    """A rank other than 0: rank 0 writes the run's files."""

    def open(self, cfg: TrainConfig, changed: dict) -> None:
        return None

    def drop_events_after(self, step: int) -> int:
        return 0

    def logged(self, event: str) -> bool:
        return False

    def event(self, record: dict) -> None:
        return None

    def summary(self, summary: dict) -> None:
        return None

    def model_file(self, path: Path, model: torch.nn.Module, arch: dict, state: dict) -> None:
        return None
