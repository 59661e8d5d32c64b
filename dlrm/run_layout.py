"""The files a run directory holds, by name: what the output rule protects from every other
output flag (hybrid_dlrm/common/outputs.py) and how a directory is recognised as a run's. Light
on purpose: `python -m dlrm.report` reads it without importing torch."""

from __future__ import annotations

from pathlib import Path

from hybrid_dlrm.common.outputs import Purpose

RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "checkpoints")


def holds_run_files(path: Path) -> bool:
    """A run directory: one a run locked (its `.lock`) or wrote any of its files in."""
    return (path / ".lock").exists() or any((path / name).exists() for name in RUN_FILES)


# --out-dir: new, empty, or a run's (run_checks.py decides whether it may be continued)
RUN_DIRECTORY = Purpose("run directory", directory=True, identify=holds_run_files)


def run_files(run: str | Path, whose: str = "the run's") -> dict[str, Path]:
    """{label: path} of the files of the run directory `run`: never written by an output flag."""
    return {f"{whose} {name}": Path(run) / name for name in RUN_FILES}
