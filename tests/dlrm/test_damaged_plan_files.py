"""A damaged --profile-file or --placement-plan (empty, garbage, truncated) is one line, exit 2."""

import os
from pathlib import Path

import pytest

from dlrm.train import main
from tests.dlrm.test_checkpoint_integrity import TINY_CLI

FAE = [*TINY_CLI, "--placement", "fae", "--hot-budget", "1KB", "--profile-sample-rate", "0.2"]


@pytest.fixture(scope="module")
def good_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    argv = [*FAE, "--out-dir", str(d / "run"), "--num-batches", "2", "--test-data-size", "64",
            "--profile-file", str(d / "profile.npz"), "--placement-plan", str(d / "plan.npz")]  # fmt: skip
    assert main(argv) == 0
    return {"--profile-file": d / "profile.npz", "--placement-plan": d / "plan.npz"}


def damaged(kind: str, good: Path, dst: Path) -> Path:
    raw = good.read_bytes()
    data = {
        "empty": b"",
        "garbage": os.urandom(200),
        "head": raw[:64],
        "half": raw[: len(raw) // 2],
        "tail cut": raw[:-10],
    }[kind]
    dst.write_bytes(data)
    return dst


@pytest.mark.parametrize("flag", ["--profile-file", "--placement-plan"])
@pytest.mark.parametrize("kind", ["empty", "garbage", "head", "half", "tail cut"])
def test_damaged_plan_or_profile_is_one_line(good_files, tmp_path, capsys, flag, kind):
    bad = damaged(kind, good_files[flag], tmp_path / "bad.npz")
    other = {"--profile-file": tmp_path / "p.npz", "--placement-plan": tmp_path / "q.npz"}
    other[flag] = bad
    argv = [*FAE, "--out-dir", str(tmp_path / "run"), "--num-batches", "2"]
    for f, path in other.items():
        argv += [f, str(path)]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    what = "access profile" if flag == "--profile-file" else "placement plan"
    assert f"{bad}: not a readable {what}" in err
    assert "pickle" not in err and "Traceback" not in err
