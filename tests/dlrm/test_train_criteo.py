"""The trainer on miniature Criteo raw files: preprocess on first use, reuse after."""

import json

import pytest

from data_pipeline.synthetic_raw import write_kaggle
from dlrm.train import main

ARCH = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1",
        "--mini-batch-size", "64", "--learning-rate", "0.1"]  # fmt: skip


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    d = tmp_path_factory.mktemp("kaggle_raw")
    write_kaggle(d, train_lines=7 * 600)
    return d / "train.txt"


@pytest.mark.usefixtures("long_training")
def test_kaggle_preprocesses_on_first_use_and_reuses(raw, tmp_path, capsys):
    processed = tmp_path / "processed"
    argv = ["--data-set", "kaggle", "--raw-data-file", str(raw), "--processed-data-file", str(processed),
            "--max-ind-range", "1000", *ARCH]  # fmt: skip
    assert main(argv + ["--out-dir", str(tmp_path / "a")]) == 0
    meta = json.loads((processed / "meta.json").read_text())
    assert meta["table_sizes"] == [1000] * 26
    stamp = (processed / "meta.json").stat().st_mtime_ns
    assert main(argv + ["--out-dir", str(tmp_path / "b")]) == 0
    assert (processed / "meta.json").stat().st_mtime_ns == stamp  # reused, not redone
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    # days 0-5 of 7 train: 3600 rows at batch 64 -> 57 steps; test is half of day 6
    assert summary["steps"] == 57 and summary["test_samples"] == 300
    # the processed directory alone is enough
    assert main(["--data-set", "kaggle", "--processed-data-file", str(processed), *ARCH,
                 "--out-dir", str(tmp_path / "c"), "--num-batches", "5"]) == 0  # fmt: skip


def test_table_count_mismatch_and_wrong_dataset(raw, tmp_path, capsys):
    processed = tmp_path / "p"
    base = [
        "--raw-data-file",
        str(raw),
        "--processed-data-file",
        str(processed),
        "--max-ind-range",
        "100",
        *ARCH,
    ]
    assert (
        main(
            [
                "--data-set",
                "kaggle",
                *base,
                "--arch-embedding-size",
                "100-100",
                "--out-dir",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert (
        "--arch-embedding-size: 2 tables given, the data set has 26 sparse features"
        in capsys.readouterr().err
    )
    small = "-".join(["100"] * 25 + ["99"])
    assert (
        main(
            [
                "--data-set",
                "kaggle",
                *base,
                "--arch-embedding-size",
                small,
                "--out-dir",
                str(tmp_path / "z"),
            ]
        )
        == 2
    )
    assert "table 25 has 99 rows but the data set's ids need 100" in capsys.readouterr().err
    assert main(["--data-set", "terabyte", "--processed-data-file", str(processed), *ARCH,
                 "--out-dir", str(tmp_path / "y")]) == 2  # fmt: skip
    assert "holds kaggle data, not terabyte" in capsys.readouterr().err
    assert (
        main(["--data-set", "kaggle", "--processed-data-file", str(tmp_path / "none"), *ARCH]) == 2
    )
    assert "is not a preprocessed data set" in capsys.readouterr().err


def test_the_dcnv2_recipes_sizes_on_hash_mode_data_are_one_line_saying_why(tmp_path, capsys):
    """terabyte-dcn.toml's tables are MLPerf's counts of the real days' renumbered ids; a dataset
    preprocessed without --contiguous-ids keeps value % M, so the recipe's small tables cannot
    hold its ids (docs/data.md)."""
    from data_pipeline.__main__ import main as data_pipeline

    assert (
        data_pipeline(
            ["synth", "--layout", "terabyte", "--out", str(tmp_path / "raw"), "--lines", "40"]
        )
        == 0
    )
    assert data_pipeline(["preprocess", "--dataset", "terabyte", "--raw", str(tmp_path / "raw"),
                          "--out", str(tmp_path / "tb"), "--max-ind-range", "1000"]) == 0  # fmt: skip
    capsys.readouterr()
    argv = ["--data-set", "terabyte", "--processed-data-file", str(tmp_path / "tb"),
            "--arch-interaction-op", "dcn", "--out-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("python -m dlrm.train: error: --arch-embedding-size: table 5 has 3 rows "
                          "but the data set's ids need 1000 (the reference recipe's sizes count "
                          "MLPerf's renumbered ids of the real days")  # fmt: skip
    assert not (tmp_path / "run" / "checkpoints").exists()
