"""`python -m hybrid_dlrm.serving.predict` on raw Criteo lines and preprocessed splits: the same mapping as in
training, out-of-vocabulary values, the Kaggle layout, malformed lines, nothing lost on errors."""

import json

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from data_pipeline.criteo_format import dense_transform
from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle
from dlrm.train import main as train
from hybrid_dlrm.serving import Predictor
from hybrid_dlrm.serving.predict import KAGGLE_FIRST_ID, format_csv
from hybrid_dlrm.serving.predict import main as predict
from hybrid_dlrm.serving.quantize import main as quantize

ARCH = ["--arch-sparse-feature-size", "4", "--arch-mlp-bot", "13-8-4", "--arch-mlp-top", "8-1",
        "--mini-batch-size", "128", "--learning-rate", "0.1"]  # fmt: skip
DAY = 300  # lines per Kaggle pseudo-day


def _csv(path):
    lines = path.read_text().splitlines()
    return lines[0], [ln.split(",") for ln in lines[1:]]


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory, long_training):  # tiny epochs
    d = tmp_path_factory.mktemp("predict")
    write_kaggle(d / "raw", 7 * DAY, 50, SyntheticSpec(vocab_cap=300))
    runs = {}
    for mode, flags in (
        ("freq", ["--frequency-threshold", "2"]),
        ("hash", ["--max-ind-range", "97"]),
        ("contiguous", ["--max-ind-range", "97", "--contiguous-ids"]),
    ):
        proc = d / f"proc_{mode}"
        assert train(["--data-set", "kaggle", "--raw-data-file", str(d / "raw" / "train.txt"),
                      "--processed-data-file", str(proc), *flags, *ARCH,
                      "--out-dir", str(d / f"run_{mode}")]) == 0  # fmt: skip
        art = d / f"art_{mode}"
        assert quantize([str(d / f"run_{mode}"), "--out", str(art), "--batch-size", "256"]) == 0
        runs[mode] = (proc, art)
    return d, runs


@pytest.mark.parametrize("mode", ["freq", "hash", "contiguous"])
@pytest.mark.usefixtures("starts_processes")
def test_raw_lines_score_as_their_preprocessed_rows(kaggle, mode, tmp_path):
    d, runs = kaggle
    proc, art = runs[mode]
    assert predict(["--model", str(art), "--data", str(d / "raw" / "train.txt"),
                    "--out", str(tmp_path / "raw.csv")]) == 0  # fmt: skip
    header, rows = _csv(tmp_path / "raw.csv")
    assert header == "line,label,predicted" and len(rows) == 7 * DAY
    assert [int(r[0]) for r in rows] == list(range(1, 7 * DAY + 1))
    assert predict(["--model", str(art), "--data", str(proc), "--split", "test",
                    "--out", str(tmp_path / "test.csv")]) == 0  # fmt: skip
    header, test_rows = _csv(tmp_path / "test.csv")
    assert header == "row,label,predicted" and len(test_rows) == DAY // 2
    # the test split is the first half of the last day: its lines, mapped the same way
    raw_part = rows[6 * DAY : 6 * DAY + DAY // 2]
    assert [r[1:] for r in raw_part] == [r[1:] for r in test_rows]


@pytest.mark.usefixtures("starts_processes")
def test_kaggle_test_txt_gets_the_submission_layout_and_unseen_values_the_oov_id(kaggle, tmp_path):
    d, runs = kaggle
    proc, art = runs["freq"]
    test_txt = d / "raw" / "test.txt"
    assert (
        predict(["--model", str(art), "--data", str(test_txt), "--out", str(tmp_path / "s.csv")])
        == 0
    )
    header, rows = _csv(tmp_path / "s.csv")
    assert header == "Id,Predicted" and len(rows) == 50
    assert [int(r[0]) for r in rows] == list(range(KAGGLE_FIRST_ID, KAGGLE_FIRST_ID + 50))
    assert all(len(r[1]) == 8 and 0.0 < float(r[1]) < 1.0 for r in rows)
    # a line whose every categorical value is new: each one maps to id 1 (seen rarely or never)
    ints = np.array([[3, 0, 1, 7, 120, 4, 1, 9, 0, 2, 0, 1, 5]], dtype=np.int64)
    line = (
        "\t".join(map(str, ints[0])) + "\t" + "\t".join(f"{0xABC00000 + i:08x}" for i in range(26))
    )
    (tmp_path / "new.txt").write_text(line + "\n")
    assert (
        predict(
            [
                "--model",
                str(art),
                "--data",
                str(tmp_path / "new.txt"),
                "--out",
                str(tmp_path / "n.csv"),
            ]
        )
        == 0
    )
    got = float(_csv(tmp_path / "n.csv")[1][0][1])
    p = Predictor.load(art)
    kjt = KeyedJaggedTensor(keys=p.feature_names, values=torch.ones(26, dtype=torch.long),
                            lengths=torch.ones(26, dtype=torch.int32))  # fmt: skip
    expected = p.predict((torch.from_numpy(dense_transform(ints)), kjt)).item()
    assert got == pytest.approx(expected, abs=5e-7)


@pytest.mark.usefixtures("starts_processes")
def test_malformed_lines_are_named_or_skipped_and_nothing_is_lost(kaggle, tmp_path, capsys):
    d, runs = kaggle
    _, art = runs["hash"]
    raw = tmp_path / "bad.txt"
    lines = (d / "raw" / "test.txt").read_text().splitlines()[:20]
    lines[6] = lines[6].replace(
        "\t", "\tzz", 1
    )  # field 2 (I2) is not an integer (no label in test.txt)
    raw.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.csv"
    out.write_text("an earlier result\n")
    # --overwrite: the existing file may be replaced, and still survives a failed run
    assert predict(["--model", str(art), "--data", str(raw), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"python -m hybrid_dlrm.serving.predict: error: {raw}:7: field 2 (I2): expected an integer"
    )
    assert err.count("\n") == 1
    assert out.read_text() == "an earlier result\n"
    assert not list(tmp_path.glob(".out.csv.tmp-*"))
    again = ["--model", str(art), "--data", str(raw), "--out", str(out), "--overwrite"]
    assert predict([*again, "--on-bad-line", "skip"]) == 0
    _, rows = _csv(out)
    assert len(rows) == 19 and int(rows[6][0]) == KAGGLE_FIRST_ID + 7  # line 7 skipped, ids kept
    assert json.loads(capsys.readouterr().out)["bad_lines"]["integer"] == 1
    (tmp_path / "short.txt").write_text("1\t2\t3\n")
    short = ["--model", str(art), "--data", str(tmp_path / "short.txt"), "--out", str(out)]
    assert predict([*short, "--overwrite"]) == 2
    assert "short.txt:1: expected 40 tab-separated fields" in capsys.readouterr().err


def test_format_csv_writes_what_it_is_given():
    ids = np.array([0, 7, 10, 60000123, 999], dtype=np.int64)
    p = np.array([0.0, 1.0, 0.5, 0.0000004, 0.1234566])
    text = format_csv([ids, None], p).decode()
    assert text.splitlines() == [
        "0,,0.000000", "7,,1.000000", "10,,0.500000", "60000123,,0.000000", "999,,0.123457",
    ]  # fmt: skip
    assert format_csv([ids], p).decode().splitlines()[3] == "60000123,0.000000"


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_predict_rows_scores_as_predict_on_the_same_batch(kaggle, backend):
    from data_pipeline.criteo import CriteoBatchSource

    d, runs = kaggle
    proc, art = runs["freq"]
    batch = CriteoBatchSource(proc, "test", 64).batch(0, 0)
    p = Predictor.load(art, backend=backend)
    kjt = batch.sparse_features  # feature-major, one id per bag, in feature order
    assert kjt.keys() == p.feature_names and torch.all(kjt.lengths() == 1)
    ids = kjt.values().view(len(kjt.keys()), -1).t()
    assert torch.equal(p.predict_rows(batch.dense_features, ids), p.predict(batch))


def test_scoring_raw_lines_imports_no_torchrec(kaggle, tmp_path):
    # torchrec takes seconds to import (its distributed stack): raw lines are scored without it
    import subprocess
    import sys

    d, runs = kaggle
    _, art = runs["hash"]
    code = (
        "import sys; from hybrid_dlrm.serving.predict import main; "
        f"rc = main(['--model', {str(art)!r}, '--data', {str(d / 'raw' / 'test.txt')!r}, "
        f"'--out', {str(tmp_path / 'p.csv')!r}]); "
        "sys.exit(rc or 3 * any(m.startswith('torchrec') for m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 51


def test_bad_thread_count_is_named(kaggle, tmp_path, capsys):
    d, runs = kaggle
    _, art = runs["hash"]
    args = [
        "--model",
        str(art),
        "--data",
        str(d / "raw" / "test.txt"),
        "--out",
        str(tmp_path / "o"),
    ]
    assert predict([*args, "--threads", "0"]) == 2
    assert "--threads: expected positive numbers" in capsys.readouterr().err
    assert predict([*args, "--threads", "1", "--workers", "0"]) == 0
