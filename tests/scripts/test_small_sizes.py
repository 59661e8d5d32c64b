"""Every script works at small sizes or says in one line why not: the cheap ones run here at
tiny sizes (the walk of issue 35 found a KeyError, a traceback for a taken run directory and a
ZeroDivisionError in bench_placement.py, and an empty probe file in bench_scm.py disk)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_bench_placement_at_small_sizes_and_a_taken_out_dir(tmp_path, capsys):
    bench = _load("bench_placement")
    argv = ["--table-scale", "0.0005", "--train-samples", "2048", "--test-samples", "512",
            "--profile-samples", "512", "--batch-size", "256", "--runs", "hotline,hotline_learned",
            "--hotline-learn-batches", "2", "--interleave-steps", "0", "--out-dir", str(tmp_path / "b")]  # fmt: skip
    assert bench.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    # the default 256MB budget holds every row: no bytes to bound, and no division by them
    assert report["hotline_oracle"]["emb_bytes_per_sample"] == 0
    assert report["hotline_vs"]["bytes_per_sample_vs_oracle"] is None
    assert report["results"]["hotline_learned"]["plan_hot_input_share_in_sample"] is None
    assert bench.main(argv) == 2  # the same directory again: one line, before any work
    err = capsys.readouterr().err
    assert err.endswith(f"error: --out-dir {tmp_path / 'b'}: already holds runs (hotline, "
                        "hotline_learned); choose a new one\n")  # fmt: skip


def test_bench_scm_disk_on_a_file_smaller_than_its_write_chunk(tmp_path, capsys):
    bench = _load("bench_scm")
    argv = ["disk", "--file-gb", "0.01", "--dir", str(tmp_path), "--seconds", "0.05",
            "--depths", "1,2"]  # fmt: skip
    assert bench.main(argv) == 0
    disk = json.loads(capsys.readouterr().out)["disk"]
    assert disk["file_gb"] == 0.01 and set(disk["depths"]) == {"1", "2"}
    assert all(d["reads_per_s"] > 0 for d in disk["depths"].values())


def test_bench_scm_kaggle_refuses_a_data_set_shorter_than_its_steps(tmp_path):
    bench = _load("bench_scm")
    with pytest.raises(SystemExit, match=r"^bench_scm.py: error: --train-samples 4096: fewer than"):
        bench.main(["kaggle", "--dir", str(tmp_path), "--train-samples", "4096", "--rounds", "1",
                    "--round-steps", "2", "--warmup-steps", "2"])  # fmt: skip


def test_bench_checkpoint_says_what_resume_pairs_needs(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPTS / "bench_checkpoint.py"), "--resume-pairs", "1"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1] == (
        "bench_checkpoint.py: error: --resume-pairs: give the run's dlrm.train flags after --, "
        "e.g. -- --out-dir runs/a"
    )


@pytest.mark.parametrize(
    "name, flag",
    [
        ("bench_planner", "--out-dir"),
        ("bench_placement", "--out-dir"),
        ("bench_tbsm_vs_dlrm", "--out"),
    ],
)
def test_the_benchmarks_run_directories_obey_the_output_rule(name, flag, tmp_path, capsys):
    """A FIFO, a symbolic link or a file where a benchmark's runs go: one line and exit 2 before
    any work (hybrid_dlrm/common/outputs.py through scripts/_shared.check_bench_out)."""
    bench = _load(name)
    fifo, link, file = tmp_path / "fifo", tmp_path / "link", tmp_path / "file"
    os.mkfifo(fifo)
    (tmp_path / "real").mkdir()
    link.symlink_to(tmp_path / "real")
    file.write_text("mine\n")
    for target, what in (
        (fifo, "is a FIFO"),
        (link, "is a symbolic link"),
        (file, "is a regular file"),
    ):
        with pytest.raises(SystemExit) as e:
            bench.main([flag, str(target)])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"error: {flag}: {target} {what}" in err, err
    assert file.read_text() == "mine\n" and fifo.exists() and link.is_symlink()


def test_bench_calibration_refuses_a_config_in_one_line(capsys):
    """A run's flags that make no config: one line and exit 2, before anything is measured."""
    assert _load("bench_calibration").main(["--", "--data-set", "terabyte"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench_calibration.py: error: --data-set terabyte: needs --raw-data-file or "
                   "--processed-data-file"]  # fmt: skip
