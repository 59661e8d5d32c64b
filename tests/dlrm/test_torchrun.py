"""`python -m dlrm.torchrun` (dlrm/torchrun.py), torch's launcher ending as every command here
ends (issue 46): a terminal's Ctrl-C or a scheduler's SIGTERM gives each rank's one line and the
signal's exit code, never the launcher's traceback and exit 1; a rank's bad flag gives one error
line per machine, the launcher's one line and exit 2, never torch's ChildFailedError block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrm.checkpoints import format as ckpt

pytestmark = pytest.mark.slow

LAUNCH = [sys.executable, "-m", "dlrm.torchrun", "--standalone", "--nproc_per_node", "2"]
TRAIN = [
    "-m", "dlrm.train", "--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
    "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
    "--data-size", str(64 * 100000), "--test-freq", "20", "--test-data-size", "128",
    "--print-freq", "0",
]  # fmt: skip
REPO = Path(__file__).resolve().parents[2]


def _ours(stderr: str) -> list[str]:
    """stderr less torch's own start-up banner (the OMP_NUM_THREADS warning, `W1128 ...`)."""
    return [x for x in stderr.splitlines() if x.strip() and not x.startswith(("W", "E", "I"))]


def _launch(args: list[str], cwd: Path, group: bool) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([*LAUNCH, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, process_group=0 if group else None)  # fmt: skip


@pytest.mark.parametrize(
    "sig, to_group, word",
    [
        (signal.SIGINT, True, "interrupted"),  # a terminal's Ctrl-C reaches every process
        (signal.SIGTERM, False, "terminated (SIGTERM)"),  # a scheduler signals the launcher
    ],
)
def test_a_signal_ends_every_rank_in_one_line_and_the_launcher_with_its_code(
    tmp_path, sig, to_group, word
):
    run = tmp_path / "run"
    p = _launch([*TRAIN, "--out-dir", "run"], tmp_path, group=True)
    try:
        deadline = time.time() + 240
        # a complete checkpoint: a shard directory appears before its files are all written
        while not ckpt.list_checkpoints(run / "checkpoints"):
            assert time.time() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.1)
        (os.killpg if to_group else os.kill)(p.pid, sig)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 128 + sig, err
    assert "Traceback" not in err and "death signal" not in err, err
    lines = sorted(_ours(err))
    assert len(lines) == 2, err
    zero, one = lines
    assert one.startswith(f"rank 1: {word} at step "), one
    assert zero.startswith(f"rank 0: {word} at step ") and "; the last checkpoint is " in zero
    command = zero.split("resume with: ")[1]
    launcher = "python -m dlrm.torchrun --standalone --nproc_per_node 2 -m dlrm.train "
    assert command.startswith(launcher) and command.endswith("--out-dir run --resume"), command


@pytest.mark.parametrize(
    "flag, said",
    [
        (
            ["--num-batchs", "3"],
            "unrecognized arguments: --num-batchs 3 (did you mean --num-batches?)",
        ),
        (["--mini-batch-size", "0"], "--mini-batch-size: expected a positive integer, got 0"),
    ],
)
def test_a_bad_flag_is_one_line_per_machine_and_exit_2(tmp_path, flag, said):
    """argparse's refusal and a setting's own check alike."""
    p = _launch(["-m", "dlrm.train", *flag], tmp_path, group=False)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    # whichever rank fails first says why; the other fails quietly or is stopped while it
    # still imports torch (and is not named): never "terminated" from a rank nobody signalled
    error, launcher = _ours(err)
    assert error == f"python -m dlrm.train: error: {said}", err
    assert launcher in (
        "python -m dlrm.torchrun: rank 0 exited with 2 (the reason is above)",
        "python -m dlrm.torchrun: rank 1 exited with 2 (the reason is above)",
        "python -m dlrm.torchrun: ranks 0, 1 exited with 2 (the reason is above)",
    ), launcher
