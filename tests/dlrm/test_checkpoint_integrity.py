"""Issue #25, part A: nothing corrupt is ever used. Checkpoints and --save-model files carry
checksums checked on load; damage is one line naming the file (and the tensor); --resume of a run
directory falls back to the newest checkpoint that verifies; interrupted writes leave nothing
behind that blocks or fills the run directory."""

import errno
import logging
import os
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_pipeline.errors import mount_point
from dlrm import Trainer
from dlrm.checkpoints import format as ckpt
from dlrm.errors import CheckpointError
from dlrm.train import main

TINY_CLI = ["--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
            "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
            "--data-size", "1920", "--test-data-size", "2048", "--progress", "false"]  # fmt: skip


NO_SUCH_PID = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # beyond any process's


def flip_bit(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x10
    path.write_bytes(bytes(raw))


def zero_4k(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    end = min(offset + 4096, len(raw))
    raw[offset:end] = bytes(end - offset)
    path.write_bytes(bytes(raw))


def truncate(path: Path, offset: int) -> None:
    path.write_bytes(path.read_bytes()[:offset])


DAMAGE = {"flip one bit": flip_bit, "zero 4 KiB": zero_4k, "truncate": truncate}


def assert_one_line_naming(e: CheckpointError, path: Path) -> str:
    message = str(e)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{path}: "), message
    assert "weights_only" not in message and "allow_pickle" not in message, message
    return message


def offset_of(path: Path, t: torch.Tensor) -> int:
    offset = path.read_bytes().find(t.contiguous().numpy().tobytes())
    assert offset > 0
    return offset


@pytest.fixture
def trained(make_config, tmp_path):
    """A finished tiny run: checkpoints at steps 10, 20 and 30 and a --save-model file."""
    cfg = make_config(test_freq=10, keep_checkpoints=3, save_model=str(tmp_path / "model.pt"))
    Trainer(cfg).fit()
    return cfg


@pytest.mark.parametrize("kind", ["checkpoint", "model file"])
@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.usefixtures("long_training")
def test_damage_anywhere_is_detected_and_named(trained, tmp_path, kind, damage):
    run = Path(trained.out_dir)
    original = (
        run / "checkpoints" / "step_000000030.pt"
        if kind == "checkpoint"
        else Path(trained.save_model)
    )
    table = ckpt.load(original)["model"]["embeddings.t_cat_2.weight"]
    size = original.stat().st_size
    in_table = offset_of(original, table) + 37
    for offset in sorted({0, 100, size // 3, size // 2, size - 200, in_table}):
        damaged = tmp_path / f"damaged-{offset}.pt"
        damaged.write_bytes(original.read_bytes())
        DAMAGE[damage](damaged, offset)
        with pytest.raises(CheckpointError) as e:
            ckpt.load(damaged)
        message = assert_one_line_naming(e.value, damaged)
        if damage != "truncate" and offset == in_table:
            assert "corrupt: tensor model/embeddings.t_cat_2.weight does not match" in message
        if damage == "truncate":  # said in words, not torch's "[Errno 22] Invalid argument"
            said = (
                "empty: 0 bytes"
                if offset == 0
                else f"cut short, or not a checkpoint: no zip directory at its end ({offset} bytes)"
            )
            assert message == f"{damaged}: not a readable checkpoint ({said})"


@pytest.mark.usefixtures("long_training")
def test_damaged_optimizer_state_is_named_not_trained_on(make_config, caplog):
    # as measured in the issue: 64 flipped bytes in the optimizer state once became NaN, and the
    # resumed run blamed divergence on the corrupt file it called "the last good checkpoint"
    cfg = make_config(test_freq=10, optimizer="adagrad")
    Trainer(cfg).fit()
    path = Path(cfg.out_dir) / "checkpoints" / "step_000000030.pt"
    state = ckpt.load(path)["dense_optimizer"]["state"]
    raw = bytearray(path.read_bytes())
    start = offset_of(path, state[0]["sum"])
    raw[start : start + 64] = bytes(b ^ 0xFF for b in raw[start : start + 64])
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"corrupt: tensor dense_optimizer/state/0/sum does"):
        Trainer(make_config(test_freq=10, optimizer="adagrad", resume=str(path)))
    with caplog.at_level(logging.WARNING):
        resumed = Trainer(make_config(test_freq=10, optimizer="adagrad", resume="auto"))
    assert resumed.state.step == 20 and resumed._last_checkpoint().name == "step_000000020.pt"


@pytest.mark.usefixtures("long_training")
def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(trained, make_config, caplog):
    checkpoints = Path(trained.out_dir) / "checkpoints"
    newest = checkpoints / "step_000000030.pt"
    flip_bit(newest, offset_of(newest, ckpt.load(newest)["model"]["top_mlp.0.weight"]))
    with caplog.at_level(logging.WARNING):
        resumed = Trainer(make_config(resume="auto", test_freq=10, keep_checkpoints=3))
    assert resumed.state.step == 20
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert (
        f"skipped 1 corrupt checkpoint(s) ({newest}: corrupt: tensor model/top_mlp.0.weight"
        in lines[0]
    )
    assert lines[0].endswith(f"resuming from {checkpoints / 'step_000000020.pt'}")
    # the resumed run rewrites step 30 and ends as the uninterrupted run did
    resumed.fit()
    assert ckpt.load(newest)["train_state"]["step"] == 30


@pytest.mark.usefixtures("long_training")
def test_resume_of_a_directory_where_nothing_verifies_names_every_file(trained, make_config):
    checkpoints = Path(trained.out_dir) / "checkpoints"
    for p in ckpt.list_checkpoints(checkpoints):
        truncate(p, 5000)
    with pytest.raises(CheckpointError, match=r"--resume: no checkpoint in .* verifies") as e:
        Trainer(make_config(resume="auto"))
    assert all(str(p) in str(e.value) for p in ckpt.list_checkpoints(checkpoints))


def run_cli(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err.strip()


def largest_record_payload(path: Path) -> int:
    """The file offset of the payload of the checkpoint's largest zip record (a tensor's bytes),
    so damage lands in tensor data whatever the records before it take."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
    return info.header_offset + 30 + name_len + extra_len


@pytest.mark.usefixtures("long_training")
def test_cli_corrupt_resume_file_is_one_line_exit_2(trained, capsys):
    path = Path(trained.out_dir) / "checkpoints" / "step_000000020.pt"
    zero_4k(path, largest_record_payload(path) + 64)
    rc, err = run_cli([*TINY_CLI, "--out-dir", trained.out_dir, "--resume", str(path)], capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"python -m dlrm.train: error: {path}: corrupt") and err.endswith(
        "checksum"
    )


class Foreign:  # a pickled object: torch's message about it advises weights_only=False
    pass


class RunsCode:  # unpickled freely, this would run a shell command
    def __reduce__(self):
        return (os.system, ("touch /tmp/this-must-never-exist",))


def test_cli_unreadable_and_foreign_files_never_advise_weights_only_false(tmp_path, capsys):
    for name, write in {
        "object.pt": lambda p: torch.save({"x": Foreign()}, p),
        "code.pt": lambda p: torch.save({"x": RunsCode()}, p),
        "truncated.pt": lambda p: p.write_bytes(b"PK\x03\x04" + bytes(300)),
        "legacy.pt": lambda p: p.write_bytes(b"\x80\x04not a zip"),
    }.items():
        path = tmp_path / name
        write(path)
        rc, err = run_cli(
            [*TINY_CLI, "--out-dir", str(tmp_path / "r"), "--resume", str(path)], capsys
        )
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert f"error: {path}: not a readable checkpoint (" in err
        for advice in ("weights_only", "allow_pickle", "Please", "trust"):
            assert advice not in err, err
        assert err.endswith(")"), err  # whole, not cut mid-sentence
        if name == "code.pt":  # a blocked global, reported without torch's marker
            assert err.endswith("which are never unpickled: Trying to load unsupported GLOBAL "
                                "posix.system whose module posix is blocked)")  # fmt: skip
        if name == "object.pt":
            assert err.endswith("which are never unpickled: Unsupported global: GLOBAL "
                                f"{Foreign.__module__}.{Foreign.__qualname__} was not an allowed global by default)")  # fmt: skip


@pytest.mark.usefixtures("long_training")
def test_cli_model_file_given_to_resume_is_named_as_such(trained, capsys):
    rc, err = run_cli(
        [*TINY_CLI, "--out-dir", trained.out_dir, "--resume", trained.save_model], capsys
    )
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{trained.save_model}: a model file (weights only, as --save-model writes)" in err
    assert "optimizer state does not fit" not in err


def stop_at_first_checkpoint(make_config, monkeypatch):
    """The run directory a run killed while writing its first checkpoint leaves: its config and
    log, and in checkpoints/ only the temporary (a kill skips the clean-up a crash gets)."""

    class Killed(BaseException):
        pass

    def killed(obj, path, what="checkpoint"):
        raise Killed

    cfg = make_config(test_freq=10)
    with monkeypatch.context() as m:
        m.setattr(ckpt, "save", killed)
        with pytest.raises(Killed):
            Trainer(cfg).fit()
    run = Path(cfg.out_dir)
    temporary = run / "checkpoints" / f".step_000000010.pt.tmp-{NO_SUCH_PID}"
    temporary.parent.mkdir()
    temporary.write_bytes(b"PK\x03\x04" + bytes(20000))
    assert (run / "config.json").exists() and (run / "metrics.jsonl").exists()
    assert not (run / "summary.json").exists()
    return cfg, temporary


@pytest.mark.usefixtures("long_training")
def test_run_killed_in_its_first_checkpoint_resumes_from_scratch(
    make_config, monkeypatch, capsys, caplog
):
    cfg, temporary = stop_at_first_checkpoint(make_config, monkeypatch)
    with caplog.at_level(logging.WARNING):
        argv = [*TINY_CLI, "--out-dir", cfg.out_dir, "--test-freq", "10", "--resume"]
        rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert f"no checkpoint in {cfg.out_dir} yet: starting from the beginning\n" in out
    assert not temporary.exists()
    names = [p.name for p in ckpt.list_checkpoints(temporary.parent)]
    assert names == ["step_000000020.pt", "step_000000030.pt"]


@pytest.mark.usefixtures("long_training")
def test_run_killed_in_its_first_checkpoint_can_be_rerun(make_config, monkeypatch, caplog):
    cfg, temporary = stop_at_first_checkpoint(make_config, monkeypatch)
    with caplog.at_level(logging.WARNING):
        summary = Trainer(make_config(test_freq=10)).fit()
    assert summary["steps"] == 30 and not temporary.exists()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"--out-dir: {cfg.out_dir} holds a run stopped before its first checkpoint; starting it again"
    ]


def test_a_run_directory_with_nothing_in_it_is_still_an_error(tmp_path, make_config):
    """Another directory than --out-dir that holds no run is a mistyped path, not a run to start:
    `--resume A` continues A's run (a run stopped before its first checkpoint starts again)."""
    empty = tmp_path / "empty"
    for made in (False, True):
        if made:
            empty.mkdir()
        with pytest.raises(CheckpointError, match=f"--resume: {empty}: no checkpoint file or run"):
            Trainer(make_config(resume=str(empty)))


@pytest.mark.usefixtures("long_training")
def test_temporaries_of_interrupted_writes_are_removed(trained, make_config):
    checkpoints = Path(trained.out_dir) / "checkpoints"
    gone = NO_SUCH_PID
    stale = [
        checkpoints / f".step_000000040.pt.tmp-{gone}",
        checkpoints / f".step_000000010.pt.tmp-{gone + 1}",
    ]
    notes = checkpoints / "notes.txt"  # not ours
    live = checkpoints / f".step_000000050.pt.tmp-{os.getppid()}"  # its writer still runs
    model_tmp = Path(trained.save_model).with_name(f".model.pt.tmp-{gone}")
    for p in [*stale, notes, live, model_tmp]:
        p.write_bytes(b"x" * 1000)
    resumed = Trainer(make_config(resume="auto", test_freq=10, keep_checkpoints=3))
    assert not any(p.exists() for p in stale) and notes.exists() and live.exists()
    stale[0].write_bytes(b"x")
    resumed.save_checkpoint()
    assert not stale[0].exists()
    resumed.save_model_file(Path(trained.save_model))
    assert not model_tmp.exists()


def test_write_errors_are_one_line_and_keep_earlier_checkpoints(make_config, monkeypatch):
    trainer = Trainer(make_config(test_freq=10))
    real_save = torch.save
    errors = iter([
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 9088 vs 9008"),
        PermissionError(errno.EACCES, "Permission denied"),
    ])  # fmt: skip

    def failing_save(obj, f, *a, **kw):
        if obj["train_state"]["step"] > 10:
            f.write(b"partial")
            raise next(errors)
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(CheckpointError) as e:
        trainer.fit()
    checkpoints = Path(trainer.cfg.out_dir) / "checkpoints"
    path = checkpoints / "step_000000020.pt"
    message = assert_one_line_naming(e.value, path)
    mount = mount_point(checkpoints)
    assert (
        f"no space left on the file system mounted at {mount} while writing the checkpoint ("
        in message
    )
    for expected in [
        "no space left on the file system",
        r"could not write the checkpoint \(Permission denied\); nothing earlier was changed",
    ]:
        with pytest.raises(CheckpointError, match=expected):
            trainer.save_checkpoint()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000000010.pt"]
    assert ckpt.load(checkpoints / "step_000000010.pt")["train_state"]["step"] == 10


def test_disk_full_on_a_real_small_file_system(make_config, tmpfs):
    mount = tmpfs("size=256k")
    try:
        trainer = Trainer(make_config(test_freq=10, out_dir=str(mount / "run")))
        real_save = ckpt.save

        def save_then_fill_the_disk(obj, path, what="checkpoint"):
            real_save(obj, path, what)
            with open(mount / "filler", "wb") as f:  # leaves a few KiB: less than a checkpoint
                while os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize > 8192:
                    f.write(bytes(4096))

        ckpt_save, ckpt.save = ckpt.save, save_then_fill_the_disk
        try:
            with pytest.raises(CheckpointError) as e:
                trainer.fit()
        finally:
            ckpt.save = ckpt_save
        checkpoints = mount / "run" / "checkpoints"
        message = assert_one_line_naming(e.value, checkpoints / "step_000000020.pt")
        assert (
            f"no space left on the file system mounted at {mount.resolve()} while writing the checkpoint"
            in message
        )
        assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000000010.pt"]
        assert ckpt.load(checkpoints / "step_000000010.pt")["train_state"]["step"] == 10
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.usefixtures("long_training")
def test_files_from_before_checksums_load_with_a_warning_after_their_crcs(
    trained, tmp_path, caplog
):
    data = ckpt.load(Path(trained.save_model))
    old = tmp_path / "old.pt"
    torch.save({**data, "version": 1}, old)  # what the code before checksums wrote
    with caplog.at_level(logging.WARNING):
        assert ckpt.load(old)["version"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{old}: written before checkpoints carried checksums; only the zip records' CRC-32s "
        "were checked (the next checkpoint will carry checksums)"
    ]
    flip_bit(old, offset_of(old, data["model"]["embeddings.t_cat_2.weight"]) + 5)
    with pytest.raises(
        CheckpointError, match=r"corrupt: record '.*/data/\d+' does not match its CRC-32"
    ):
        ckpt.load(old)


# --- fuzzing: random damage to a small checkpoint ---------------------------------------------

SMALL = {
    "format": ckpt.FORMAT,
    "version": ckpt.VERSION,
    "arch": {"model": "dlrm", "widths": (13, 4), "optimizer": "adagrad"},
    "model": {"w": torch.arange(24, dtype=torch.float32).reshape(6, 4), "b": torch.ones(4)},
    "dense_optimizer": {"state": {0: {"sum": torch.full((6, 4), 0.5)}}, "param_groups": [{"lr": 0.1}]},
    "train_state": {"step": 7, "loss_sum": 1.25, "last_eval": {"auc": 0.75}},
}  # fmt: skip


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """SMALL written as a checkpoint (module-scoped: hypothesis reruns the test in one call)."""
    path = tmp_path_factory.mktemp("fuzz") / "original.pt"
    ckpt.save(SMALL, path)
    return path


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.lists(st.tuples(st.integers(0, 2**20), st.integers(1, 255)), min_size=1, max_size=4)
)
def test_random_damage_is_an_error_or_changes_nothing(small, changes):
    raw = bytearray(small.read_bytes())
    for where, xor in changes:
        raw[where % len(raw)] ^= xor
    damaged = small.with_name("damaged.pt")
    damaged.write_bytes(bytes(raw))
    try:
        loaded = ckpt.load(damaged)
    except CheckpointError as e:
        assert_one_line_naming(e, damaged)
        return
    # only bytes torch never reads changed (zip timestamps, padding, the CRCs it does not check)
    assert same(SMALL, loaded)


def test_the_fuzzed_checkpoint_loads_whole_when_undamaged(small):
    assert same(SMALL, ckpt.load(small))


@pytest.mark.usefixtures("long_training")
def test_cli_corrupt_model_file_given_to_load_model_is_one_line_exit_2(trained, tmp_path, capsys):
    path = Path(trained.save_model)
    flip_bit(path, offset_of(path, ckpt.load(path)["model"]["bottom_mlp.0.weight"]) + 3)
    argv = [*TINY_CLI, "--out-dir", str(tmp_path / "inf"), "--load-model", str(path)]
    rc, err = run_cli([*argv, "--inference-only"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err == (
        f"python -m dlrm.train: error: {path}: corrupt: tensor model/bottom_mlp.0.weight does not "
        "match its checksum"
    )


@pytest.mark.usefixtures("long_training")
def test_a_verified_checkpoint_from_another_version_names_the_file(trained, make_config, tmp_path):
    data = ckpt.load(Path(trained.out_dir) / "checkpoints" / "step_000000030.pt")
    data["train_state"]["future_field"] = 1  # written by a later version of the trainer
    path = tmp_path / "future.pt"
    ckpt.save(data, path)
    with pytest.raises(
        CheckpointError, match=f"^{path}: train state: unknown fields future_field$"
    ):
        Trainer(make_config(resume=str(path), out_dir=str(tmp_path / "r")))


@pytest.mark.usefixtures("long_training")
def test_resuming_a_finished_run_changes_nothing_and_says_so(trained, tmp_path, capsys, caplog):
    # Issue 37, 4 (the general case): a finished plain run resumed trains nothing and writes
    # nothing (metrics.jsonl gained a resume event, summary.json and config.json were written
    # again), exit 0 with one line.
    files = [p for p in sorted(tmp_path.rglob("*")) if p.is_file()]
    before = {p: p.read_bytes() for p in files}
    argv = ["--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
            "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--mini-batch-size", "64",
            "--data-size", str(64 * 30), "--test-data-size", "2048", "--learning-rate", "0.1", "--print-freq", "10",
            "--test-freq", "10", "--keep-checkpoints", "3", "--out-dir", trained.out_dir,
            "--save-model", trained.save_model, "--progress", "false", "--resume"]  # fmt: skip
    with caplog.at_level(logging.INFO):
        rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == []  # no logger-style line: the CLI's own style, on stdout
    # the start-up line (threads), where it resumed, and that it is finished: no summary
    lines = out.out.splitlines()
    assert [x.split()[0] for x in lines] == ["threads", "resumed", "run"]
    assert lines[1].startswith("resumed from ") and lines[1].endswith(
        " at step 30 (1 of 1 epochs done)"
    )
    assert lines[2] == "run already finished at step 30; nothing to do"
    assert "Traceback" not in out.err
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before
