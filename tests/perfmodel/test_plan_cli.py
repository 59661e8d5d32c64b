"""`python -m perfmodel plan <the trainer's flags>`: --placement auto's table (or its decision as
JSON) without training and without writing anything; bad flags end in one line, exit 2."""

from __future__ import annotations

import json

from dlrm.placement import auto as planner
from embeddings.room import MemoryInventory, Room
from perfmodel.__main__ import main

MiB, GiB = 2**20, 2**30
TINY = ["--arch-embedding-size", "200000-100000-5000-70", "--arch-sparse-feature-size", "4",
        "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
        "--data-size", "1920", "--test-data-size", "256"]  # fmt: skip


def exit_code(argv: list[str]) -> int:
    """main's return value, or the status of the exit its flag parser makes (`python -m`'s)."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


def test_plan_prints_the_table_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["plan", *TINY, "--out-dir", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("--placement auto: device (every table fits on the device")
    assert lines[2].split()[:2] == ["candidate", "ms/step"] and "CHOSEN" in lines[3]
    assert not run.exists()


def test_plan_json_weighs_every_placement_under_a_small_device(tmp_path, capsys, monkeypatch):
    room = MemoryInventory(Room(2 * MiB, "fake"), Room(8 * GiB, "fake"), Room(64 * GiB, "fake"))
    monkeypatch.setattr(planner, "inventory", lambda *a, **k: room)
    run = tmp_path / "run"
    assert main(["plan", *TINY, "--placement", "device", "--out-dir", str(run), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    kinds = {c["placement"] for c in d["candidates"]}
    assert kinds == {"device", "host", "fae", "hotline", "tiered"}
    (chosen,) = [c for c in d["candidates"] if c["label"] == d["chosen"]]
    assert chosen["rejected"] is None and chosen["needs"]["device"] <= 2 * MiB * (
        1 - planner.PLAN_MARGIN
    )
    assert d["candidates"][0]["rejected"].startswith("CUDA memory short by")
    # the profile was made in memory (a predictor may measure the disk where the tier would be)
    assert not [p for p in run.rglob("*") if p.is_file()]


def test_plan_bad_flags_are_one_line_exit_2(tmp_path, capsys):
    for argv, expected in (
        (["plan", "--mini-batch-size", "x"], "--mini-batch-size: invalid int value: 'x'"),
        (["plan", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["plan", *TINY, "--memory-limit", "lots"], "--memory-limit"),
    ):
        assert exit_code(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err
        assert err.startswith("python -m perfmodel plan")


def test_plan_ctrl_c_while_planning_is_one_line_exit_130(tmp_path, capsys, monkeypatch):
    """Issue 46: Ctrl-C during planning ended in a KeyboardInterrupt traceback."""

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(planner, "inventory", interrupted)  # reached while planning
    run = tmp_path / "run"
    assert main(["plan", *TINY, "--out-dir", str(run)]) == 130
    assert capsys.readouterr().err == "\ninterrupted; nothing written\n"
    assert not run.exists()


def test_plan_bags_past_the_memory_are_one_line_exit_2(tmp_path, capsys):
    """Issue 46: `plan --multi-hot-sizes 1000000` died in a numpy allocation of 244 GiB."""
    argv = ["plan", *TINY, "--multi-hot-sizes", "1000000", "--memory-limit", "4GB"]
    assert main([*argv, "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "python -m perfmodel plan: error: --multi-hot-sizes: bags of 4,000,000 ids per sample "
        "need 244.3 GiB for a chunk of synthetic samples (8,192 samples) but this process may use "
    ) and err.endswith(" (--memory-limit 4GiB); use smaller bags\n")


def test_plan_a_batch_past_the_memory_is_refused_before_a_batch_is_read(
    tmp_path, capsys, monkeypatch
):
    """Issue 46: `plan --mini-batch-size 1000000000` generated batches of that size for its profile
    (a hang of minutes) before finding that nothing fits."""
    from data_pipeline.synthetic import SyntheticBatchSource

    def made(*a):
        raise AssertionError("a batch was made")

    monkeypatch.setattr(SyntheticBatchSource, "batch", made)
    argv = ["plan", *TINY, "--mini-batch-size", "1000000000", "--test-mini-batch-size", "64"]
    assert main([*argv, "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m perfmodel plan: error: --placement auto: needs ")
    assert err.endswith(
        "; no placement fits: the batch alone does not; use a smaller --mini-batch-size\n"
    )
