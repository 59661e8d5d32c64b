"""Each data set's defaults are its whole reference recipe (REFERENCE_ARCH and
REFERENCE_TRAINING in dlrm/config.py): filled where a field was not given, printed at start, and
any field given explicitly wins. The proof on a small planted Taobao set: TBSM on the defaults
trains exactly as the spelled-out reference recipe does, and the old defaults (batch 2048, SGD)
stayed at chance."""

from __future__ import annotations

import pytest

from data_pipeline.taobao import TaobaoOptions, preprocess_taobao
from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior
from dlrm.config import REFERENCE_TRAINING, TrainConfig
from dlrm.train import config_from_args
from dlrm.trainer import Trainer

T = 5
# as tests/dlrm/test_tbsm_proof.py: the next category follows the last one, so history decides
PLANTED = PlantedBehavior(num_users=600, min_events=20, max_events=40, num_categories=8,
                          items_per_category=50, recent=1, follow=0.8, seed=1)  # fmt: skip
TBSM_REFERENCE = ["--arch-sparse-feature-size", "16", "--arch-mlp-bot", "1-16", "--arch-mlp-top", "15-15",
                  "--mini-batch-size", "256", "--test-mini-batch-size", "-1", "--optimizer", "adagrad",
                  "--learning-rate", "0.05", "--lr-num-warmup-steps", "0", "--lr-decay-start-step", "0",
                  "--lr-num-decay-steps", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    write_user_behavior(root / "ub.csv", PLANTED)
    return preprocess_taobao(
        root / "ub.csv", root / "data", TaobaoOptions(ts_length=T, points_per_user=10)
    )


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _fit(directory, out, extra):
    args = ["--model", "tbsm", "--data-set", "taobao", "--processed-data-file", str(directory),
            "--ts-length", str(T), "--progress=false", "--print-freq", "0", "--embedding-backend",
            "torch", "--out-dir", str(out), *extra]  # fmt: skip
    cfg = config_from_args(args)
    return cfg, Trainer(cfg).fit()


@pytest.mark.usefixtures("long_training")
def test_tbsm_defaults_train_as_the_spelled_out_reference_recipe(planted, tmp_path):
    cfg, default = _fit(planted, tmp_path / "default", [])
    assert (cfg.mini_batch_size, cfg.eval_batch_size, cfg.optimizer, cfg.learning_rate) == (
        256, 256, "adagrad", 0.05,
    )  # fmt: skip
    line = cfg.describe_reference_defaults()
    assert line == "tbsm on taobao: reference settings " + " ".join(TBSM_REFERENCE)
    explicit_cfg, explicit = _fit(planted, tmp_path / "explicit", TBSM_REFERENCE)
    assert explicit_cfg.reference_defaults == {}  # everything given: nothing taken or printed
    assert (default["test_auc"], default["steps"]) == (explicit["test_auc"], explicit["steps"])
    assert default["test_auc"] > 0.6, default["test_auc"]
    # what the defaults were before (the synthetic run's batch and optimizer): chance level
    _, old = _fit(planted, tmp_path / "old", ["--mini-batch-size", "2048", "--optimizer", "sgd",
                                              "--learning-rate", "0.1", "--test-mini-batch-size", "-1"])  # fmt: skip
    assert old["test_auc"] < 0.55 < default["test_auc"] - 0.05, (old["test_auc"], default)


@pytest.mark.parametrize(
    "data_set,expected",
    [("kaggle", (128, 16384, "sgd", 0.1)), ("terabyte", (2048, 16384, "sgd", 0.1))],
)
def test_criteo_recipes_are_the_reference_scripts(data_set, expected):
    # facebookresearch/dlrm bench/dlrm_s_criteo_{kaggle,terabyte}.sh: neither sets an optimizer
    # or a schedule (SGD, constant rate)
    cfg = config_from_args(["--data-set", data_set, "--raw-data-file", "raw"])
    assert (
        cfg.mini_batch_size,
        cfg.test_mini_batch_size,
        cfg.optimizer,
        cfg.learning_rate,
    ) == expected
    assert (cfg.lr_num_warmup_steps, cfg.lr_decay_start_step, cfg.lr_num_decay_steps) == (0, 0, 0)
    line = cfg.describe_reference_defaults()
    assert f"--mini-batch-size {expected[0]} --test-mini-batch-size {expected[1]}" in line
    assert f"--optimizer {expected[2]} --learning-rate {expected[3]}" in line


def test_a_given_field_wins_and_is_not_printed():
    cfg = config_from_args(["--data-set", "kaggle", "--raw-data-file", "raw", "--optimizer",
                            "adagrad", "--lr-num-warmup-steps", "10", "--test-mini-batch-size", "64"])  # fmt: skip
    assert (cfg.optimizer, cfg.lr_num_warmup_steps, cfg.test_mini_batch_size) == ("adagrad", 10, 64)
    assert cfg.mini_batch_size == 128 and cfg.learning_rate == 0.1  # the rest still the recipe
    line = cfg.describe_reference_defaults()
    assert "--optimizer" not in line and "--lr-num-warmup-steps" not in line
    assert "--test-mini-batch-size" not in line and "--mini-batch-size 128" in line
    # the same by flat name (the library's TrainConfig), and the schedule rule sees filled values
    lib = TrainConfig(data_set="terabyte", raw_data_file="raw", learning_rate=1.0)
    assert (lib.learning_rate, lib.mini_batch_size) == (1.0, 2048)
    assert "learning_rate" not in lib.reference_defaults


def test_the_synthetic_demonstration_keeps_its_quick_step_unprinted():
    cfg = TrainConfig()
    assert (cfg.mini_batch_size, cfg.optimizer, cfg.learning_rate, cfg.eval_batch_size) == (
        2048, "sgd", 0.1, 2048,
    )  # fmt: skip
    assert not set(REFERENCE_TRAINING[("dlrm", "kaggle")]) & set(cfg.reference_defaults)


def test_a_schedule_that_decays_inside_the_warm_up_is_refused_after_the_recipe_fills_it():
    from dlrm.errors import ConfigError

    with pytest.raises(ConfigError, match="^--lr-decay-start-step: the decay must start after"):
        TrainConfig(lr_num_warmup_steps=100, lr_num_decay_steps=10)  # decay start: the recipe's 0
