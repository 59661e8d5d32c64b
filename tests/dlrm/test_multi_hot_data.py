"""--multi-hot-sizes / --multi-hot-distribution from the flags to the batches: parsing and its
one-line errors, MLPerf's sizes in the Terabyte DCN recipe, --resume refusing another data shape,
and short runs on multi-hot synthetic and materialised Criteo data (placement device)."""

from __future__ import annotations

import pytest
import torch

from data_pipeline.criteo import PreprocessOptions, preprocess
from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle
from dlrm.config import MLPERF_DCNV2_MULTI_HOT, TrainConfig
from dlrm.data import build_data
from dlrm.errors import ConfigError
from dlrm.run_checks import check_resume_settings
from dlrm.train import config_from_args, main
from dlrm.trainer import Trainer
from tests.dlrm.test_cli import TINY  # three tables

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_flags_parse_dashes_and_commas():
    assert config_from_args(["--multi-hot-sizes", "3,2-1"]).multi_hot_sizes == (3, 2, 1)
    cfg = config_from_args(["--multi-hot-sizes", "4", "--multi-hot-distribution", "pareto",
                            "--data-set", "kaggle", "--processed-data-file", "d"])  # fmt: skip
    assert (cfg.multi_hot_sizes, cfg.multi_hot_distribution) == ((4,), "pareto")
    absent = config_from_args([])
    assert (absent.multi_hot_sizes, absent.multi_hot_distribution) == (None, "uniform")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--multi-hot-sizes", "3-x-1"], "--multi-hot-sizes: expected whole numbers separated by"),
        (["--multi-hot-sizes", "3--1"], "--multi-hot-sizes: expected whole numbers separated by"),
        (["--multi-hot-sizes", "2-0-1"], "--multi-hot-sizes: every bag size must be at least 1"),
        (
            ["--multi-hot-sizes", "3-2"],
            "--multi-hot-sizes: expected one size per categorical feature (3) or one for all, got 2",
        ),
        (
            ["--multi-hot-distribution", "zipf"],
            "--multi-hot-distribution: expected one of uniform, pareto, got 'zipf'",
        ),
        (
            ["--multi-hot-sizes", "2", "--multi-hot-distribution", "pareto"],
            "--multi-hot-distribution: synthetic bags are Zipf draws (--synthetic-zipf)",
        ),
        (
            ["--data-set", "taobao", "--raw-data-file", "x.csv", "--multi-hot-sizes", "2"],
            "--multi-hot-sizes: not with --data-set taobao",
        ),
    ],
)
def test_mistakes_are_one_line_and_exit_2(argv, message, capsys, tmp_path):
    try:
        rc = main(TINY + argv + ["--out-dir", str(tmp_path / "r")])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err


TERABYTE = dict(data_set="terabyte", processed_data_file="terabyte_dir")  # not opened here


def test_terabyte_dcn_recipe_brings_mlperf_bag_sizes_and_they_can_be_overridden():
    cfg = TrainConfig(**TERABYTE, arch_interaction_op="dcn")
    assert cfg.multi_hot_sizes == MLPERF_DCNV2_MULTI_HOT and len(MLPERF_DCNV2_MULTI_HOT) == 26
    assert sum(MLPERF_DCNV2_MULTI_HOT) == 214
    assert "--multi-hot-sizes 3-2-1-2-6-1" in cfg.describe_reference_defaults()
    one_hot = TrainConfig(**TERABYTE, arch_interaction_op="dcn", multi_hot_sizes=(1,))
    assert one_hot.multi_hot_sizes == (1,)  # one id per feature: the one-hot path
    assert TrainConfig(**TERABYTE).multi_hot_sizes is None  # the dot recipe: one-hot as before
    given = TrainConfig(**TERABYTE, arch_interaction_op="dcn", arch_mlp_top=(64, 1))
    assert given.multi_hot_sizes is None  # other architecture flags: not the MLPerf recipe


def test_resume_refuses_other_bags_even_when_allowed(tmp_path):
    base = dict(TERABYTE, multi_hot_sizes=(2,), out_dir=str(tmp_path))
    before = TrainConfig(**base).to_json()
    for change in (dict(multi_hot_sizes=(3,)), dict(multi_hot_distribution="pareto")):
        cfg = TrainConfig(**{**base, **change}, allow_changed=tuple(change))
        with pytest.raises(
            ConfigError, match=r"^--resume: run was trained on other bags \(--multi"
        ):
            check_resume_settings(before, cfg, "run")
    same = TrainConfig(**base, multi_hot_materialize=False)  # the same bags: free
    assert check_resume_settings(before, same, "run") == {}


def test_all_ones_is_the_one_hot_data(make_config):
    a = build_data(make_config()).train.batch(0, 1)
    b = build_data(make_config(multi_hot_sizes=(1,))).train.batch(0, 1)
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
    assert torch.equal(a.labels, b.labels)


@pytest.mark.usefixtures("long_training")
def test_synthetic_multi_hot_trains_on_placement_device(make_config):
    cfg = make_config(multi_hot_sizes=(3, 1, 8, 2), placement="device", data_size=64 * 120,
                      test_freq=0, print_freq=0, embedding_backend="torch")  # fmt: skip
    batch = build_data(cfg).train.batch(0, 0).sparse_features
    assert batch.lengths().tolist() == [3] * 64 + [1] * 64 + [8] * 64 + [2] * 64
    summary = Trainer(cfg).fit()
    # seeded, so exact; 0.56 here, where the one-hot data of this tiny model stays at 0.50
    assert summary["test_auc"] > 0.53, summary["test_auc"]


def test_criteo_multi_hot_is_materialised_beside_the_data_and_trains(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_kaggle(raw, 7 * 64, 25, SyntheticSpec(seed=2, vocab_cap=300))
    data = preprocess("kaggle", raw, tmp_path / "kaggle", PreprocessOptions(max_ind_range=200))
    args = ["--data-set", "kaggle", "--processed-data-file", str(data), "--multi-hot-sizes",
            "2-1-3-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-4-1-1-1-1-1", "--arch-sparse-feature-size",
            "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1", "--mini-batch-size", "32",
            "--test-mini-batch-size", "64", "--print-freq", "0", "--progress=false",
            "--out-dir", str(tmp_path / "run")]  # fmt: skip
    cfg = config_from_args(args)
    splits = build_data(cfg)
    made = list(tmp_path.glob("kaggle.multihot-uniform-*"))
    assert len(made) == 1 and (made[0] / "meta.json").is_file()
    kjt = splits.train.batch(0, 0).sparse_features
    assert (
        kjt["cat_20"].lengths().tolist() == [4] * 32 and kjt["cat_1"].lengths().tolist() == [1] * 32
    )
    summary = Trainer(cfg).fit()
    assert summary["test_auc"] == summary["test_auc"]  # finite: it trained and evaluated
    loaded = config_from_args([*args, "--multi-hot-materialize", "false"])
    again = build_data(loaded).train.batch(0, 0).sparse_features
    assert again.values().equal(kjt.values()) and again.lengths().equal(kjt.lengths())


def test_bench_terabyte_dcnv2_recipes_train_on_mlperf_bags(tmp_path):
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_terabyte.sh"
    (tmp_path / "day_0").write_text("")
    for args in (["--mlperf-dcnv2", str(tmp_path)], ["--mlperf-dcnv2-small"]):
        out = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                             env={**os.environ, "PYTHON": sys.executable, "DRY_RUN": "1"},
                             check=True).stdout  # fmt: skip
        words = shlex.split(out)
        flags = {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--")}
        cfg = config_from_args(["--multi-hot-sizes", flags["--multi-hot-sizes"]])
        assert cfg.multi_hot_sizes == MLPERF_DCNV2_MULTI_HOT, args
        assert flags["--multi-hot-distribution"] == "uniform"
