"""The files that steer a resume (dlrm/resume_files.py): `placement_decision.json`, config.json,
the access profile and the placement plan are trusted only when they agree with the checkpoint;
an edited one is one line naming the file, the field and both values, each on its side. A run
stopped before its first checkpoint (even before config.json) starts again on `--resume`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlrm.errors import ConfigError
from dlrm.placement import auto as planner
from dlrm.placement.decision_file import DECISION_NAME
from dlrm.placement.run_plan import PLAN_NAME, PROFILE_NAME
from dlrm.train import main
from dlrm.trainer import Trainer
from tests.dlrm.conftest import assert_resumed_exactly

# 305,070 rows of 4 floats: with --hot-budget 1MB no table set fits it, and without a predictor
# auto chooses fae by preference (as dlrm/placement/auto.py's rule of before the planner did)
AUTO = dict(
    arch_embedding_size=(200_000, 100_000, 5_000, 70), placement="auto", hot_budget="1MB",
    test_data_size=256, data_size=64 * 10, test_freq=10, keep_checkpoints=5,
)  # fmt: skip
TAIL = "put the checkpoint's value back (or delete the file: the checkpoint's decision is written again), or start a new run"  # noqa: E501


@pytest.fixture
def no_predictor(monkeypatch):
    monkeypatch.setattr(planner, "default_planner", lambda: planner.Planner(predictor=None))


@pytest.fixture
def auto_run(make_config, no_predictor):
    """An auto run of 10 steps, checkpointed at step 10 (its decision: fae)."""
    cfg = make_config(**AUTO)
    Trainer(cfg).fit()
    return cfg


def _edit(path: Path, change) -> dict:
    data = json.loads(path.read_text())
    before = json.loads(json.dumps(data))
    change(data)
    path.write_text(json.dumps(data, indent=2))
    return before


def _refusal(cfg_maker, **kw) -> str:
    with pytest.raises(ConfigError) as e:
        Trainer(cfg_maker(**kw))
    return str(e.value)


def test_every_edited_field_of_the_decision_is_refused(auto_run, make_config, capsys):
    run = auto_run.run_dir
    path = run / DECISION_NAME
    written = json.loads(path.read_text())
    assert written["settings"]["placement"] == "fae"
    budget = written["settings"]["hot_budget"]
    resume = dict(AUTO, nepochs=2, resume="auto")
    edits = [
        (lambda d: d["settings"].update(placement="hotline"),
         'placement is "hotline" but the checkpoint at step 10 was trained with "fae"'),
        (lambda d: d["settings"].update(hot_budget=budget * 4),
         f"hot_budget is {budget * 4} but the checkpoint at step 10 was trained with {budget}"),
        (lambda d: d["settings"].update(scm_cache=2**20),
         "scm_cache is 1048576 but the checkpoint at step 10 was trained with absent"),
        # the label the table prints and the rows a candidate keeps on the device
        (lambda d: d.update(chosen="fae, hot 4KiB"),
         f'chosen is "fae, hot 4KiB" but the checkpoint at step 10 recorded "{written["chosen"]}"'),
        (lambda d: d["candidates"][2].update(hot_budget=7),
         f"candidates[2].hot_budget is 7 but the checkpoint at step 10 recorded "
         f"{written['candidates'][2]['hot_budget']}"),
    ]  # fmt: skip
    for change, field in edits:
        before = _edit(path, change)
        capsys.readouterr()
        assert _refusal(make_config, **resume) == f"--resume: {path}: {field}; {TAIL}"
        assert "--placement auto:" not in capsys.readouterr().out  # no table of the edited one
        path.write_text(json.dumps(before, indent=2))
    # through the command line: the same line, exit code 2
    _edit(path, lambda d: d["settings"].update(placement="hotline"))
    rc = main(_cli(auto_run, "--nepochs", "2", "--resume"))
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        rc == 2
        and len(err) == 1
        and err[0].endswith(
            f'{path}: placement is "hotline" but the checkpoint at step 10 was trained with "fae"; {TAIL}'
        )
    )


def _cli(cfg, *more) -> list[str]:
    """`cfg`'s run as a command line (the tiny model's flags, AUTO's)."""
    return ["--arch-embedding-size", "200000-100000-5000-70", "--arch-sparse-feature-size", "4",
            "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
            "--data-size", str(64 * 10), "--test-data-size", "256", "--learning-rate", "0.1",
            "--print-freq", "10", "--progress", "false", "--placement", "auto",
            "--hot-budget", "1MB", "--test-freq", "10", "--keep-checkpoints", "5",
            "--out-dir", str(cfg.run_dir), *more]  # fmt: skip


@pytest.mark.usefixtures("long_training")
def test_a_deleted_decision_is_written_again_from_the_checkpoint_and_resumes_exactly(
    make_config, tmp_path, no_predictor, capsys
):
    full = Trainer(make_config(**dict(AUTO, nepochs=2), out_dir=str(tmp_path / "full")))
    want = full.fit()
    cut = make_config(**AUTO, out_dir=str(tmp_path / "cut"))
    Trainer(cut).fit()  # 10 steps, checkpointed at step 10
    path = cut.run_dir / DECISION_NAME
    written = path.read_text()
    path.unlink()
    capsys.readouterr()
    resumed = Trainer(make_config(**dict(AUTO, nepochs=2), out_dir=cut.out_dir, resume="auto"))
    got = resumed.fit()
    assert path.read_text() == written  # the checkpoint's own, byte for byte
    assert f"the checkpoint's at step 10, written again to {path}" in capsys.readouterr().out
    assert_resumed_exactly(full, resumed, (want, got), ["test_auc", "test_logloss", "steps"])


# --- config.json ----------------------------------------------------------------------------------


@pytest.fixture
def ten_steps(make_config):
    cfg = make_config(data_size=64 * 10, test_freq=10)
    Trainer(cfg).fit()
    return cfg


def test_an_edited_config_json_is_refused_as_the_file_s_value(ten_steps, make_config):
    path = ten_steps.run_dir / "config.json"
    _edit(path, lambda d: d.update(learning_rate=0.2))
    again = dict(data_size=64 * 10, test_freq=10, nepochs=2, resume="auto")
    assert _refusal(make_config, **again) == (
        f"--resume: {path}: learning_rate is 0.2 but the checkpoint at step 10 was trained with "
        "0.1; put the checkpoint's value back (or delete the file: it is written again), or "
        "start a new run"
    )
    # the same edit with this run asking for it: the change is this run's, against the
    # checkpoint's value (never the file's)
    ckpt = ten_steps.run_dir / "checkpoints" / "step_000000010.pt"
    assert _refusal(make_config, **again, learning_rate=0.2) == (
        f"--resume: {ckpt} was trained with other settings (--learning-rate 0.1 -> 0.2); resume "
        "with the same ones, or pass --allow-changed learning-rate"
    )
    # as a resume allowed to change it leaves the file when stopped before its next checkpoint
    t = Trainer(make_config(**again, learning_rate=0.2, allow_changed=("lr",)))
    assert t.state.step == 10 and t._resume_changes == {"learning_rate": (0.1, 0.2)}
    path.unlink()  # written again from this run's settings
    Trainer(make_config(**again))


def test_a_config_json_the_checkpoint_agrees_with_is_not_blamed(ten_steps, make_config):
    """config.json as written, the command changed: the checkpoint is named with its value."""
    ckpt = ten_steps.run_dir / "checkpoints" / "step_000000010.pt"
    got = _refusal(make_config, data_size=64 * 10, test_freq=10, resume="auto", seed=7)
    assert got.startswith(f"--resume: {ckpt} was trained with other settings (--seed ")


# --- the profile and the plan ---------------------------------------------------------------------


FAE = dict(placement="fae", hot_budget="2KB", data_size=64 * 5, test_freq=5)


def _fae(make_config, tmp_path, name: str, **kw):
    """A fae run of 5 steps, checkpointed at step 5."""
    cfg = make_config(**(FAE | kw), out_dir=str(tmp_path / name))
    Trainer(cfg).fit()
    return cfg


def test_a_swapped_plan_or_profile_is_refused(make_config, tmp_path):
    a = _fae(make_config, tmp_path, "a")
    again = dict(FAE, nepochs=2, out_dir=a.out_dir, resume="auto")
    plan, profile = a.run_dir / PLAN_NAME, a.run_dir / PROFILE_NAME
    kept = {p: p.read_bytes() for p in (plan, profile)}
    Trainer(make_config(**again))  # unedited: the plan rewritten by the resume is the same
    # another budget's plan: other hot rows
    b = _fae(make_config, tmp_path, "b", hot_budget="1KB")
    shutil.copy(b.run_dir / PLAN_NAME, plan)
    theirs, ours = _hot(plan.read_bytes()), _hot(kept[plan])
    assert theirs != ours
    assert _refusal(make_config, **again) == (
        f"--resume: {plan}: hot_rows is {theirs} but the checkpoint at step 5 was trained with "
        f"{ours}; put back the placement plan the run was trained with, or start a new run"
    )
    plan.write_bytes(kept[plan])
    # another run's profile (another seed: other counts)
    c = _fae(make_config, tmp_path, "c", seed=5)
    shutil.copy(c.run_dir / PROFILE_NAME, profile)
    got = _refusal(make_config, **again)
    assert got.startswith(f"--resume: {profile}: its contents (CRC-32 ")
    assert got.endswith(
        "are not the access profile the checkpoint at step 5 was trained with (CRC-32 "
        f"{_identity(kept[profile], tmp_path)}); put back the access profile the run was trained with, "
        "or start a new run"
    )


def _identity(npz: bytes, tmp_path: Path) -> str:
    """The CRC-32 a checkpoint records of a profile of these bytes."""
    from dlrm.placement.plan_files import identity

    (tmp_path / "kept.npz").write_bytes(npz)
    return identity(tmp_path / "kept.npz", "profile")["crc32"]


def _hot(npz: bytes) -> int:
    import io

    import numpy as np

    with np.load(io.BytesIO(npz), allow_pickle=False) as z:
        return sum(json.loads(str(z["meta"]))["hot_rows"])


# --- a run stopped before its first checkpoint ----------------------------------------------------


def test_a_run_killed_before_config_json_starts_again_on_resume(make_config, tmp_path, capsys):
    """As a kill in its first steps leaves it: the lock file, a metrics line (one cut short), no
    config.json, no checkpoint. A supervisor's `--resume` starts it from the beginning, and the
    run is the uninterrupted one."""
    short = dict(data_size=64 * 8, test_freq=8)
    full = Trainer(make_config(**short, out_dir=str(tmp_path / "full")))
    want = full.fit()
    run = tmp_path / "killed"
    run.mkdir()
    (run / ".lock").write_text("999999\n")  # flock is gone with its process; the file stays
    (run / "metrics.jsonl").write_text('{"event": "train", "step": 3, "loss": 0.7}\n{"event": "tr')
    capsys.readouterr()
    resumed = Trainer(make_config(**short, out_dir=str(run), resume="auto"))
    assert capsys.readouterr().out == f"no checkpoint in {run} yet: starting from the beginning\n"
    got = resumed.fit()
    assert_resumed_exactly(full, resumed, (want, got), ["test_auc", "test_logloss", "steps"])
    assert json.loads((run / "config.json").read_text())["resume"] is None  # a new run's


def test_a_supervisor_retrying_with_resume_recovers_from_a_kill_9(tmp_path):
    """`python -m dlrm.train ... --resume` killed (SIGKILL) as soon as it holds the run
    directory, before any config.json or checkpoint: the same command again runs to the end."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    argv = [sys.executable, "-m", "dlrm.train", "--arch-embedding-size", "60-40-500-7",
            "--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-16-4", "--arch-mlp-top",
            "16-1", "--mini-batch-size", "64", "--data-size", "1920", "--test-data-size", "256",
            "--progress", "false", "--out-dir", str(run), "--resume"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (run / ".lock").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert first.returncode == -signal.SIGKILL
    assert not (run / "checkpoints").exists() and not (run / "summary.json").exists()
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"no checkpoint in {run} yet: starting from the beginning" in again.stdout
    assert json.loads((run / "summary.json").read_text())["steps"] == 30
