import subprocess
import sys

import pytest

from dlrm.train import config_from_args, main

TINY = ["--arch-embedding-size", "30-20-10", "--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4",
        "--arch-mlp-top", "8-1", "--mini-batch-size", "32", "--data-size", "320", "--test-data-size", "256"]  # fmt: skip


def test_reference_flags_map_to_config():
    cfg = config_from_args(
        [
            "--arch-mlp-bot",
            "13-512-256-64-16",
            "--numpy-rand-seed",
            "7",
            "--inference-only",
            "false",
            "--arch-interaction-itself",
            "--test-mini-batch-size",
            "4096",
            "--optimizer",
            "adagrad",
        ]  # fmt: skip
    )
    assert cfg.arch_mlp_bot == (13, 512, 256, 64, 16) and cfg.seed == 7
    assert cfg.inference_only is False and cfg.arch_interaction_itself is True
    assert cfg.eval_batch_size == 4096 and cfg.optimizer == "adagrad"
    assert config_from_args(["--seed", "3"]).seed == 3
    assert config_from_args(["--inference-only=True", "--load-model", "m.pt"]).inference_only
    assert config_from_args([]).flush_denormal is True
    assert config_from_args(["--flush-denormal=false"]).flush_denormal is False


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--arch-mlp-bot", "13-512-8"],
            "--arch-mlp-bot: last width (8) must equal the embedding dimension (4)",
        ),
        (["--arch-mlp-top", "512-2"], "--arch-mlp-top: last width must be 1"),
        (
            ["--optimizer", "adam"],
            "--optimizer: expected one of sgd, adagrad, rowwise_adagrad, got 'adam'",
        ),
        (["--arch-mlp-bot", "13-x-16"], "--arch-mlp-bot: expected dash-separated integers"),
        (
            ["--inference-only", "maybe"],
            "argument --inference-only: expected true or false, got 'maybe'",
        ),
        (["--mini-batch-size", "0"], "--mini-batch-size: expected a positive integer, got 0"),
        (["--load-model", "/no/such/model.pt"], "--load-model: no such file: /no/such/model.pt"),
        (
            ["--data-set", "kaggle"],
            "--data-set kaggle: needs --raw-data-file or --processed-data-file",
        ),
        (["--bogus-flag", "1"], "unrecognized arguments: --bogus-flag 1"),
        (["--num-batchs", "3"], "--num-batchs 3 (did you mean --num-batches?)"),
        (
            ["--hot-budget", "-1GB"],
            "--hot-budget: expected a size like 256MB, 1.5GB or 1048576, got '-1GB'",
        ),
        (["--hot-budjet=3MB"], "--hot-budjet=3MB (did you mean --hot-budget?)"),
    ],
)
def test_user_mistakes_get_one_line_and_exit_2(argv, message, capsys, tmp_path):
    try:
        rc = main(TINY + argv + ["--out-dir", str(tmp_path / "r")])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err


def test_module_runs_end_to_end(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "dlrm.train", *TINY, "--out-dir", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "test AUC" in out.stdout and "samples/s" in out.stdout
    assert (tmp_path / "r" / "summary.json").exists()


def test_each_data_set_gets_its_reference_architecture_printed_at_start(tmp_path, capsys):
    from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior

    raw = tmp_path / "ub.csv"
    write_user_behavior(raw, PlantedBehavior(num_users=60, min_events=8, max_events=12, seed=2))
    rc = main(["--model", "tbsm", "--data-set", "taobao", "--raw-data-file", str(raw), "--ts-length", "4",
               "--mini-batch-size", "32", "--num-batches", "2", "--out-dir", str(tmp_path / "r")])  # fmt: skip
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert ("tbsm on taobao: reference settings --arch-sparse-feature-size 16 --arch-mlp-bot 1-16 "
            "--arch-mlp-top 15-15") in out.out  # fmt: skip
    terabyte = config_from_args(
        ["--data-set", "terabyte", "--raw-data-file", "day", "--arch-mlp-top", "64-1"]
    )
    assert (terabyte.arch_sparse_feature_size, terabyte.arch_mlp_bot) == (64, (13, 512, 256, 64))
    assert terabyte.max_ind_range == 10_000_000 and terabyte.arch_mlp_top == (
        64,
        1,
    )  # given flags win
    assert "arch_mlp_top" not in terabyte.reference_defaults
    given = ["--arch-sparse-feature-size", "16", "--arch-mlp-bot", "13-16", "--arch-mlp-top", "4-1"]
    assert (
        config_from_args(given).describe_reference_defaults() == ""
    )  # nothing taken: nothing printed
