"""One style for every line a command says (hybrid_dlrm/common/cli_lines.py, issue 45): a
warning from anywhere in the library reads `python -m X: warning: ...` like the commands' own
`python -m X: error: ...`, never `WARNING dlrm.module.path: ...`; `-v`'s detail is a plain line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _stderr(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize("verbose", [False, True])
def test_library_records_in_the_commands_style(verbose):
    err = _stderr(
        "import logging\n"
        "from hybrid_dlrm.common.cli_lines import log_to_stderr\n"
        f"log_to_stderr('python -m dlrm.train', verbose={verbose})\n"
        "log = logging.getLogger('dlrm.checkpoints.format')\n"
        "log.info('day_0: not written yet; writing it')\n"
        "log.warning('%s: the newest checkpoint is damaged; resuming from %s', 'step_20', 'step_10')\n"
        "log.error('rank 1: gone')\n"
    )
    said = ["day_0: not written yet; writing it"] if verbose else []
    said += [
        "python -m dlrm.train: warning: step_20: the newest checkpoint is damaged; resuming "
        "from step_10",
        "python -m dlrm.train: error: rank 1: gone",
    ]
    assert err.splitlines() == said


def test_a_caller_that_set_up_logging_keeps_it():
    err = _stderr(
        "import logging\n"
        "logging.basicConfig(format='MINE %(message)s')\n"
        "from hybrid_dlrm.common.cli_lines import log_to_stderr\n"
        "log_to_stderr('python -m dlrm.train')\n"
        "logging.getLogger('dlrm').warning('kept')\n"
    )
    assert err.splitlines() == ["MINE kept"]


def test_a_train_warning_names_the_command(tmp_path):
    """A real warning of `python -m dlrm.train` (--compile is off with --perf-log)."""
    done = subprocess.run(
        [sys.executable, "-m", "dlrm.train", "--arch-embedding-size", "60-40-500-7",
         "--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1",
         "--mini-batch-size", "64", "--num-batches", "4", "--compile", "true",
         "--perf-log", str(tmp_path / "perf.jsonl"), "--out-dir", str(tmp_path / "run")],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warned = [x for x in done.stderr.splitlines() if "--perf-log" in x]
    assert warned == [
        "python -m dlrm.train: warning: --compile: off with --perf-log (the performance model "
        "traces eager steps)"
    ], done.stderr
    assert "WARNING" not in done.stderr
