"""A multi-hot run's quantized export is calibrated on the run's own bags, not on one id per
feature: the batches `hybrid_dlrm.serving.quantize` draws from the run's synthetic world or its Criteo data
carry bags of the run's `--multi-hot-sizes` (the same bags training read)."""

from __future__ import annotations

import pytest

import hybrid_dlrm.serving.quantize as quantize_cli
from data_pipeline.criteo import PreprocessOptions, preprocess
from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle
from dlrm.data import build_data
from dlrm.train import config_from_args
from dlrm.trainer import Trainer
from hybrid_dlrm.serving.inference_data import data_source, load_source

SMALL = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1",
         "--mini-batch-size", "32", "--test-mini-batch-size", "64", "--print-freq", "0",
         "--progress=false"]  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def lengths_per_feature(batch) -> dict[str, set[int]]:
    kjt = batch.sparse_features
    return {k: set(kjt[k].lengths().tolist()) for k in kjt.keys()}


def calibration_batches(monkeypatch, run, tmp_path) -> list:
    drawn = []
    take = quantize_cli.take_batches

    def recording(source, limit):
        got = take(source, limit)
        drawn.extend(got.items)
        return got

    monkeypatch.setattr(quantize_cli, "take_batches", recording)
    argv = [str(run), "--out", str(tmp_path / "int8"), "--emb-precision", "int8",
            "--batch-size", "64", "--batches", "2"]  # fmt: skip
    assert quantize_cli.main(argv) == 0
    assert 1 <= len(drawn) <= 2  # a small split may hold one batch
    return drawn


def test_a_synthetic_multi_hot_run_is_calibrated_on_its_bags(monkeypatch, tmp_path):
    args = [*SMALL, "--arch-embedding-size", "60-40-500-7", "--multi-hot-sizes", "3-1-5-2",
            "--data-size", "320", "--test-data-size", "128", "--out-dir", str(tmp_path / "run")]  # fmt: skip
    cfg = config_from_args(args)
    Trainer(cfg).fit()
    for batch in calibration_batches(monkeypatch, tmp_path / "run", tmp_path):
        assert lengths_per_feature(batch) == {
            "cat_0": {3}, "cat_1": {1}, "cat_2": {5}, "cat_3": {2}
        }  # fmt: skip
    # the bags of the run's own world: its test split, as training evaluated it
    source = data_source(load_source(tmp_path / "run"), None, "test", 64)
    trained = build_data(cfg).test
    assert (
        source.batch(0, 0)
        .sparse_features.values()
        .equal(trained.batch(0, 0).sparse_features.values())
    )


def test_a_one_hot_run_is_still_calibrated_on_one_id_per_feature(monkeypatch, tmp_path):
    args = [*SMALL, "--arch-embedding-size", "60-40-500-7", "--data-size", "320",
            "--test-data-size", "128", "--out-dir", str(tmp_path / "run")]  # fmt: skip
    Trainer(config_from_args(args)).fit()
    for batch in calibration_batches(monkeypatch, tmp_path / "run", tmp_path):
        assert set().union(*lengths_per_feature(batch).values()) == {1}


def test_a_criteo_multi_hot_run_is_calibrated_on_its_bags_and_writes_nothing(monkeypatch, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_kaggle(raw, 7 * 64, 25, SyntheticSpec(seed=2, vocab_cap=300))
    data = preprocess("kaggle", raw, tmp_path / "kaggle", PreprocessOptions(max_ind_range=200))
    sizes = [1] * 26
    sizes[1], sizes[20] = 3, 4
    args = [*SMALL, "--data-set", "kaggle", "--processed-data-file", str(data),
            "--multi-hot-sizes", "-".join(map(str, sizes)), "--multi-hot-materialize", "false",
            "--out-dir", str(tmp_path / "run")]  # fmt: skip
    cfg = config_from_args(args)
    Trainer(cfg).fit()
    before = sorted(p.name for p in tmp_path.iterdir())
    drawn = calibration_batches(monkeypatch, tmp_path / "run", tmp_path)
    for batch in drawn:
        lengths = lengths_per_feature(batch)
        assert lengths["cat_1"] == {3} and lengths["cat_20"] == {4} and lengths["cat_0"] == {1}
    # the bags training read on the same split: bit for bit
    trained = build_data(cfg)
    val = data_source(load_source(tmp_path / "run"), None, "test", 64).batch(0, 0)
    assert val.sparse_features.values().equal(trained.test.batch(0, 0).sparse_features.values())
    # nothing materialised beside the data set (the export's one new entry is its artifact)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "int8"])
