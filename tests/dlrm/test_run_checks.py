"""Checks before any long work: each CLI mistake is one line and exit 2; a resume is the same run."""

import json
import math
import shutil
from pathlib import Path

import pytest

from dlrm import Trainer
from dlrm.checkpoints import format as ckpt
from dlrm.errors import ConfigError
from dlrm.train import main
from tests.dlrm.test_checkpoint_integrity import TINY_CLI


def run_cli(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--seed", "-1"], "--seed: expected an integer from 0 to 4294967295, got -1"),
        (["--seed", str(2**64)], "--seed: expected an integer from 0 to 4294967295"),
        (["--synthetic-zipf", "-1"], "--synthetic-zipf: expected a finite number >= 0"),
        (["--synthetic-zipf", "nan"], "--synthetic-zipf: expected a finite number >= 0"),
        (["--learning-rate", "nan"], "--learning-rate: expected a positive finite number, got nan"),
        (["--learning-rate", "inf"], "--learning-rate: expected a positive finite number, got inf"),
        (["--inference-only"], "--inference-only: needs the weights to evaluate"),
    ],
)
def test_a_bad_setting_is_one_line_and_nothing_is_written(tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    rc, err = run_cli([*TINY_CLI, "--out-dir", str(out), *extra], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_out_dir_that_is_a_file_and_save_model_that_is_a_directory(tmp_path, capsys):
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    rc, err = run_cli([*TINY_CLI, "--out-dir", str(a_file)], capsys)
    assert rc == 2 and err.endswith(
        f"--out-dir: {a_file} is a regular file; expected the name of a run directory"
    ), err
    assert a_file.read_text() == "mine"
    rc, err = run_cli(
        [*TINY_CLI, "--out-dir", str(tmp_path / "r"), "--save-model", str(tmp_path)], capsys
    )
    assert rc == 2 and err.endswith(
        f"--save-model: {tmp_path} is a directory; expected the name of a model file"
    )
    assert not (tmp_path / "r").exists()  # refused before training, not after


def test_out_dir_on_a_read_only_file_system_is_one_line(tmpfs, capsys):
    read_only_dir = tmpfs("ro,size=1m")  # root ignores permission bits, not a read-only mount
    out = read_only_dir / "run"
    rc, err = run_cli([*TINY_CLI, "--out-dir", str(out)], capsys)
    assert rc == 2 and err.endswith(
        f"--out-dir: {out} cannot be written: {read_only_dir} is not writable"
    )


def test_too_little_free_space_for_a_checkpoint_is_refused_before_training(
    make_config, monkeypatch
):
    free = shutil.disk_usage("/")._replace(free=1000)
    monkeypatch.setattr("dlrm.run_checks.shutil.disk_usage", lambda p: free)
    # in units that show the numbers (a full disk read "0.00 GiB free ... about 0.00 GiB")
    with pytest.raises(
        ConfigError,
        match=r"--out-dir: 1000 B free .* a checkpoint of this model takes about \d+\.\d (KiB|MiB)$",
    ):
        Trainer(make_config())


@pytest.fixture
def stopped_run(make_config, tmp_path):
    """A run of 30 steps whose newest checkpoint is at step 20 while its log goes on to 30 (as
    after a kill), next to the uninterrupted run's log."""
    cfg = make_config(test_freq=10, keep_checkpoints=3, out_dir=str(tmp_path / "a"))
    full = Trainer(cfg)
    summary = full.fit()
    run = Path(cfg.out_dir)
    complete_log = (run / "metrics.jsonl").read_text()
    (run / "checkpoints" / "step_000000030.pt").unlink()
    (run / "summary.json").unlink()
    return cfg, summary, complete_log


def events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        e = json.loads(line)
        out.append({k: v for k, v in e.items() if not k.endswith("_s") and "per_s" not in k})
    return out


@pytest.mark.usefixtures("long_training")
def test_a_resumed_log_reads_as_one_run_and_times_add_up(make_config, stopped_run):
    cfg, summary, complete_log = stopped_run
    resumed = Trainer(
        make_config(test_freq=10, keep_checkpoints=3, out_dir=cfg.out_dir, resume="auto")
    )
    again = resumed.fit()
    log = events((Path(cfg.out_dir) / "metrics.jsonl").read_text())
    marks = [e for e in log if e["event"] == "resume"]
    assert len(marks) == 1 and marks[0]["step"] == 20 and marks[0]["dropped_events"] > 0
    timing_free = [e for e in log if e["event"] not in ("resume", "checkpoint")]
    expected = [e for e in events(complete_log) if e["event"] != "checkpoint"]
    assert [(e["event"], e["step"]) for e in timing_free] == [
        (e["event"], e["step"]) for e in expected
    ]
    assert again["test_auc"] == summary["test_auc"]
    at_20 = ckpt.load(Path(cfg.out_dir) / "checkpoints" / "step_000000020.pt")
    before = at_20["train_state"]["time_breakdown_s"]["compute_s"]
    assert again["time_breakdown_s"]["compute_s"] > before > 0  # the whole run's, not the tail's


@pytest.mark.usefixtures("long_training")
def test_resume_with_other_settings_is_refused_unless_allowed(make_config, stopped_run, capsys):
    cfg, _, _ = stopped_run
    with pytest.raises(ConfigError, match=r"--seed 123 -> 5.*--allow-changed seed"):
        Trainer(make_config(out_dir=cfg.out_dir, resume="auto", seed=5, test_freq=10))
    # what only watches or stores the run may change freely
    free = dict(print_freq=3, keep_checkpoints=5, test_freq=10)
    Trainer(make_config(out_dir=cfg.out_dir, resume="auto", **free))
    lr = make_config(out_dir=cfg.out_dir, resume="auto", learning_rate=0.05, test_freq=10,
                     allow_changed=("lr",))  # fmt: skip
    Trainer(lr).fit()
    run = Path(cfg.out_dir)
    assert json.loads((run / "config.json").read_text())["learning_rate"] == 0.05
    mark = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-6:]
    changed = [e["changed_settings"] for e in mark if e["event"] == "resume"]
    assert changed == [{"learning_rate": {"before": 0.1, "now": 0.05}}]
    with pytest.raises(ConfigError, match="--allow-changed: no setting named 'speed'"):
        Trainer(make_config(out_dir=cfg.out_dir, resume="auto", allow_changed=("speed",)))


@pytest.mark.usefixtures("long_training")
def test_resume_into_another_run_is_refused_and_into_an_empty_directory_continues(
    make_config, stopped_run, tmp_path
):
    cfg, summary, _ = stopped_run
    other = make_config(out_dir=str(tmp_path / "b"), data_size=64 * 5)
    Trainer(other).fit()
    b_summary = (tmp_path / "b" / "summary.json").read_text()
    with pytest.raises(ConfigError, match="already holds another run; resuming .* would overwrite"):
        Trainer(make_config(out_dir=other.out_dir, resume=cfg.out_dir, test_freq=10))
    assert (tmp_path / "b" / "summary.json").read_text() == b_summary
    fresh = make_config(
        out_dir=str(tmp_path / "c"), resume=cfg.out_dir, test_freq=10, keep_checkpoints=3
    )
    assert Trainer(fresh).fit()["test_auc"] == summary["test_auc"]
    assert math.isclose(json.loads((tmp_path / "c" / "config.json").read_text())["seed"], cfg.seed)


@pytest.mark.parametrize("flag", ["--profile-file", "--placement-plan", "--perf-log"])
def test_profile_plan_and_perf_log_paths_are_checked_before_any_work(tmp_path, capsys, flag):
    a_file = tmp_path / "taken"
    a_file.write_text("mine")
    out = tmp_path / "run"
    cases = [(str(a_file / "x.npz"), f"{a_file / 'x.npz'} cannot be created: {a_file} is a file")]
    if flag == "--perf-log":  # a directory
        cases = [
            (str(a_file / "x"), f"{a_file / 'x'} cannot be created: {a_file} is a file"),
            (
                str(a_file),
                f"{a_file} is a regular file; expected the name of a perf trace directory",
            ),
        ]
    else:
        what = "access profile" if flag == "--profile-file" else "placement plan"
        cases.append((str(tmp_path), f"{tmp_path} is a directory; expected the name of a {what}"))
    for value, message in cases:
        rc, err = run_cli([*TINY_CLI, "--placement", "fae", "--out-dir", str(out), flag, value],
                          capsys)  # fmt: skip
        assert rc == 2 and err == f"python -m dlrm.train: error: {flag}: {message}", err
        assert not out.exists() and a_file.read_text() == "mine"


@pytest.mark.usefixtures("long_training")
def test_resume_of_a_run_whose_config_json_is_damaged(make_config, stopped_run, caplog):
    cfg, summary, _ = stopped_run
    config = Path(cfg.out_dir) / "config.json"
    config.write_text("{ half")
    with caplog.at_level("WARNING"):
        resumed = Trainer(
            make_config(test_freq=10, keep_checkpoints=3, out_dir=cfg.out_dir, resume="auto")
        )
    assert f"{config}: damaged (not a JSON object of settings)" in caplog.text
    assert resumed.fit()["test_auc"] == summary["test_auc"]
    assert json.loads(config.read_text())["seed"] == cfg.seed  # written again
    # the checkpoint's own settings are still checked
    config.write_text("[]")
    with pytest.raises(ConfigError, match=r"step_000000030\.pt was trained with other settings"):
        Trainer(make_config(out_dir=cfg.out_dir, resume="auto", seed=5, test_freq=10))
