"""An interpreter without the stack (the system Python beside the .venv/ that `make venv` built)
gets one line naming the fix and exit code 2 from every command, never a traceback; a library
user gets a StackMissing (a ModuleNotFoundError) with the same words."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybrid_dlrm.common import stack

ROOT = Path(__file__).resolve().parents[3]

COMMANDS = [
    ["dlrm.train", "--num-batches", "2"],
    ["dlrm.train", "--help"],
    ["dlrm.report", "runs/x"],
    ["data_pipeline", "synth", "--layout", "kaggle", "--out", "x"],
    ["perfmodel", "predict"],
    ["hybrid_dlrm.serving.quantize", "--help"],
    ["hybrid_dlrm.serving.predict", "--help"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_command_under_a_python_without_the_stack_says_how_to_fix_it(command, tmp_path):
    # -S: no site-packages, so neither torch nor numpy; the checkout is found from the cwd
    done = subprocess.run([sys.executable, "-S", "-m", *command], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "numpy, torch, torchrec not installed for" in lines[0]
    assert "make venv" in lines[0] and ".venv/bin/python" in lines[0]
    assert done.stdout == ""


def test_a_library_user_gets_a_typed_error(monkeypatch):
    monkeypatch.setattr(stack, "STACK", ("numpy", "no_such_module_of_the_stack"))
    monkeypatch.setattr(sys, "argv", ["script.py"])
    with pytest.raises(stack.StackMissing, match="no_such_module_of_the_stack not installed") as e:
        stack.require("dlrm")
    assert (
        isinstance(e.value, ModuleNotFoundError) and e.value.name == "no_such_module_of_the_stack"
    )


def test_with_the_stack_installed_nothing_happens():
    stack.require("dlrm")  # this test's interpreter has the stack


def test_a_library_run_prints_no_torch_fx_notice(tmp_path):
    """torchrec's KeyedJaggedTensor trips torch.fx's "is_fx_tracing will return true ..." on first
    use; every package face quiets it, so a library user's first line is not that."""
    code = ("from dlrm import Trainer, TrainConfig; "
            f"Trainer(TrainConfig(num_batches=2, out_dir={str(tmp_path / 'r')!r}, progress=False, "
            "data_size=4096, test_data_size=2048)).fit()")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "is_fx_tracing" not in done.stderr + done.stdout
