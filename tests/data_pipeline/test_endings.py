"""Issue 46, one way to end: Ctrl-C in `python -m data_pipeline preprocess` (whose worker
processes share the terminal's process group, so they get it too) and in multi-hot
materialisation is one line and exit 130, never a traceback per process; what is left is the
resumable part (preprocessing) or nothing (bags)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys

import numpy as np

from data_pipeline import multi_hot
from data_pipeline.__main__ import main
from data_pipeline.criteo import PreprocessOptions, preprocess
from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ctrl_c_in_preprocessing_with_workers_is_one_line_and_resumable(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    write_kaggle(raw, 250_000, 0, SyntheticSpec(seed=1, vocab_cap=1000))
    argv = [sys.executable, "-m", "data_pipeline", "-v", "preprocess", "--dataset", "kaggle",
            "--raw", str(raw / "train.txt"), "--out", str(out), "--workers", "2",
            "--block-mb", "1", "--no-progress"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)  # fmt: skip
    before = []
    while (line := p.stderr.readline()) and "day_0: not written yet" not in line:
        before.append(line)  # the encoding pass has started: the workers hold blocks
    assert line, "".join(before)
    os.killpg(p.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the parent and its workers
    _, err = p.communicate(timeout=300)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    said = [x for x in err.splitlines() if x.strip()]  # -v's progress lines, then the ending
    assert said[-1] == (
        f"interrupted; the parts finished so far are kept in {out}; the same command finishes "
        "the rest"
    )
    assert not any("interrupted" in x or "error" in x for x in said[:-1]), said
    assert not (out / "meta.json").exists()
    # the same command finishes it, as one uninterrupted preprocessing makes it
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    clean = preprocess("kaggle", raw, tmp_path / "clean", PreprocessOptions(workers=0))
    meta, ref = (json.loads((d / "meta.json").read_text()) for d in (out, clean))
    assert meta["rows"] == ref["rows"] and meta["table_sizes"] == ref["table_sizes"]
    for part in ("day_0", "day_6"):
        for column in ("labels", "dense", "sparse"):
            name = f"{part}.{column}.npy"
            assert np.array_equal(np.load(out / name), np.load(clean / name)), name


def test_ctrl_c_in_multi_hot_materialisation_is_one_line_and_leaves_nothing(
    tmp_path, capsys, monkeypatch
):
    raw = tmp_path / "raw"
    write_kaggle(raw, 7 * 40 + 3, 0, SyntheticSpec(seed=2, vocab_cap=300))
    source = preprocess("kaggle", raw, tmp_path / "kaggle", PreprocessOptions(max_ind_range=500))
    finish, parts = multi_hot.NpyWriter.finish, []

    def finish_then_ctrl_c(self):
        parts.append(finish(self))
        if len(parts) == 2:  # two parts written, the rest to come
            raise KeyboardInterrupt
        return parts[-1]

    monkeypatch.setattr(multi_hot.NpyWriter, "finish", finish_then_ctrl_c)
    capsys.readouterr()  # preprocessing's own lines
    out = tmp_path / "bags"
    assert main(["multi-hot", str(source), "--sizes", "3", "--out", str(out)]) == 130
    assert capsys.readouterr().err == (
        "\ninterrupted; the partial bags were removed; the same command makes them\n"
    )
    assert sorted(x.name for x in tmp_path.iterdir()) == [".bags.lock", "kaggle", "raw"]
    fd = os.open(tmp_path / ".bags.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: the next command takes it
    finally:
        os.close(fd)
