"""One process at a time in a run directory and in an SSD tier (issue 37, item 3): the second gets
one line naming the directory and the holder's process id; a killed holder leaves nothing stuck."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hybrid_dlrm.common.lock import DirectoryLock, LockError

ROOT = Path(__file__).resolve().parents[2]


def _holder(directory: Path, name: str = ".lock") -> subprocess.Popen:
    """Another process that holds the lock of `directory` until it is killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from hybrid_dlrm.common.lock import DirectoryLock
        DirectoryLock({str(directory)!r}, {name!r}).acquire("--out-dir")
        print("held", flush=True)
        time.sleep(600)
    """)  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_in_one_line_and_a_killed_holder_frees_the_directory(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(LockError) as e:
            DirectoryLock(tmp_path).acquire("--out-dir")
        msg = str(e.value)
        assert "\n" not in msg and str(tmp_path) in msg and f"process {proc.pid}" in msg
        assert msg.startswith("--out-dir: ")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lock = DirectoryLock(tmp_path).acquire("--out-dir")  # the kernel released the killed one's
    assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
    lock.release()


def test_the_same_process_may_take_its_own_lock_again(tmp_path):
    # in-process tools and tests build a second Trainer on the same directory (a resume after an
    # exception): the lock is against other processes
    a = DirectoryLock(tmp_path).acquire("--out-dir")
    b = DirectoryLock(tmp_path).acquire("--out-dir")
    a.release()
    proc_code = f"from hybrid_dlrm.common.lock import DirectoryLock; DirectoryLock({str(tmp_path)!r}).acquire('x')"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", proc_code], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and "is in use by another process" in done.stderr  # b holds it
    b.release()
    done = subprocess.run(
        [sys.executable, "-c", proc_code], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_two_runs_in_the_same_out_dir_the_second_is_one_line(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    proc = _holder(out)
    try:
        args = ["--arch-embedding-size", "60-40-500-7", "--arch-sparse-feature-size", "4",
                "--arch-mlp-bot", "13-16-4", "--arch-mlp-top", "16-1", "--data-size", "128",
                "--progress", "false", "--out-dir", str(out)]  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "dlrm.train", *args], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert f"--out-dir: {out}" in lines[0] and f"process {proc.pid}" in lines[0]
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_a_default_run_directory_taken_in_the_same_second_moves_to_the_next_name(
    tmp_path, monkeypatch
):
    """Two runs started in the same second both default to runs/<that second>: the one that
    finds it held takes the next name (as a run a second later would) instead of failing; a
    directory the user named is still refused."""
    from dlrm.compose import _lock_run_dir
    from dlrm.config import TrainConfig
    from dlrm.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20260101-000000")
    first, second = TrainConfig(), TrainConfig()
    assert first.run.out_dir == second.run.out_dir == "runs/20260101-000000"
    # another run's hold: a lock of this process counts as another's when not reentrant
    held = DirectoryLock(first.run_dir, reentrant=False).acquire("--out-dir")
    try:
        lock = _lock_run_dir(second)
        assert second.run.out_dir == "runs/20260101-000000-1"
        assert lock.dir == Path("runs/20260101-000000-1")
        lock.release()
        named = TrainConfig(out_dir="runs/20260101-000000")
        with pytest.raises(ConfigError, match=r"^--out-dir: runs/20260101-000000 is in use by "):
            _lock_run_dir(named)
    finally:
        held.release()


def test_a_default_run_directory_a_finished_run_took_in_the_same_second_moves_too(
    tmp_path, monkeypatch
):
    """The walk's two pages: `make run` finished in runs/<second> before another run of that
    second took its lock; the lock was free, the directory held a run ("already holds a run")."""
    from dlrm.compose import _lock_run_dir
    from dlrm.config import TrainConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("time.strftime", lambda fmt: "20260101-000000")
    first, second = TrainConfig(), TrainConfig()
    done = Path(first.run.out_dir)
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")  # a run that ended there
    (done / "summary.json").write_text("{}")
    lock = _lock_run_dir(second)
    try:
        assert second.run.out_dir == "runs/20260101-000000-1"
    finally:
        lock.release()
