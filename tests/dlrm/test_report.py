"""`python -m dlrm.report`: the PNG of a run's curves, its one-line errors, and the run files'
optional TensorBoard scalars (through a fake writer: TensorBoard is not a dependency)."""

import json
import sys
from pathlib import Path

import pytest

from dlrm import report
from dlrm.run_files import RunFiles


def write_run(path: Path, events: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


EVENTS = [
    {"event": "train", "step": 10, "epoch": 0, "loss": 0.6, "samples_per_s": 1000.0},
    {"event": "train", "step": 20, "epoch": 0, "loss": 0.5, "samples_per_s": 1200.0},
    {"event": "eval", "step": 20, "epoch": 0, "test_auc": 0.71},
    {"event": "checkpoint", "step": 20, "epoch": 0, "path": "x"},
]


def test_curves_are_read_and_drawn_for_several_runs(tmp_path, capsys):
    a = write_run(tmp_path / "a", EVENTS)
    b = write_run(tmp_path / "b", EVENTS[:2])
    got = report.read_run(a)
    assert got.loss == [(10, 0.6), (20, 0.5)] and got.auc == [(20, 0.71)]
    assert got.rate == [(10, 1000.0), (20, 1200.0)]
    out = tmp_path / "plots" / "both.png"
    assert report.main([str(a), str(b), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert report.main([str(a)]) == 0 and (a / "curves.png").is_file()  # one run: beside it


def one_line_error(capsys, argv) -> str:
    assert report.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m dlrm.report: error: ")
    return err


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "empty: no metrics.jsonl" in one_line_error(capsys, [str(empty)])
    assert "not a run directory" in one_line_error(capsys, [str(tmp_path / "nothing")])
    bad = write_run(tmp_path / "bad", EVENTS)
    with open(bad / "metrics.jsonl", "a") as f:
        f.write('{"event": "train", "st\n')  # cut by a kill
    err = one_line_error(capsys, [str(bad)])
    assert "metrics.jsonl:5: not a JSON object" in err
    assert not (bad / "curves.png").exists()


def test_without_matplotlib_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    run = write_run(tmp_path / "a", EVENTS)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    assert "matplotlib is not installed" in one_line_error(capsys, [str(run)])


class FakeBoard:
    def __init__(self, directory: Path) -> None:
        self.directory, self.scalars, self.flushed = directory, [], 0

    def add_scalar(self, tag, value, step) -> None:
        self.scalars.append((tag, value, step))

    def flush(self) -> None:
        self.flushed += 1


def test_run_files_give_every_numeric_field_to_tensorboard(make_config, tmp_path):
    boards = []
    files = RunFiles(tmp_path / "run", lambda d: boards.append(FakeBoard(d)) or boards[-1])
    files.open(make_config(), {})
    for e in EVENTS:
        files.event(e)
    files.summary({"test_auc": 0.71})
    (board,) = boards
    assert board.directory == tmp_path / "run" / "tensorboard" and board.flushed == 1
    assert board.scalars == [
        ("train/loss", 0.6, 10), ("train/samples_per_s", 1000.0, 10),
        ("train/loss", 0.5, 20), ("train/samples_per_s", 1200.0, 20),
        ("eval/test_auc", 0.71, 20),
    ]  # fmt: skip
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == EVENTS  # the JSON lines are as without it


def test_tensorboard_setting():
    from dlrm.errors import ConfigError
    from dlrm.run_files import tensorboard_writer

    assert tensorboard_writer(False) is None
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        assert tensorboard_writer(None) is None  # auto: nothing, no word
        with pytest.raises(ConfigError, match="--tensorboard: TensorBoard is not installed"):
            tensorboard_writer(True)
    else:
        assert callable(tensorboard_writer(None)) and callable(tensorboard_writer(True))


def test_a_run_is_named_with_its_model_placement_and_final_auc_and_resumes_are_read(tmp_path):
    run = write_run(tmp_path / "r", [*EVENTS, {"event": "resume", "step": 20, "epoch": 0},
                                     {"event": "eval", "step": 40, "epoch": 1, "test_auc": 0.74}])  # fmt: skip
    (run / "config.json").write_text(json.dumps({"model": "tbsm", "placement": "hotline"}))
    (run / "summary.json").write_text(json.dumps({"test_auc": 0.7412345}))
    got = report.read_run(run)
    assert got.resumes == [20] and got.auc == [(20, 0.71), (40, 0.74)]
    assert got.label == f"{run}, tbsm, placement hotline, test AUC 0.7412"
    # files that are missing or damaged leave the name alone: the curves are what counts
    (run / "summary.json").write_bytes(b"\xff\xfe")
    assert report.read_run(run).label == f"{run}, tbsm, placement hotline"


def test_a_non_utf8_byte_in_the_metrics_is_one_line(tmp_path, capsys):
    run = write_run(tmp_path / "r", EVENTS)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"event": "train", "step": 30, "loss": 0.4\xff}\n')
    assert "metrics.jsonl:5: not a JSON object" in one_line_error(capsys, [str(run)])
