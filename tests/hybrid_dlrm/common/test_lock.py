"""Waits that end (issue 46): the directory lock waits only while a living process holds it; a
lock held although the process that took it has ended, and a place where the lock file cannot
be made, are one line at once. Locks are held here by a second open file description of this
process (flock conflicts between descriptions), so no process is started."""

from __future__ import annotations

import errno
import fcntl
import os
import time

import pytest

from hybrid_dlrm.common import lock as lock_module
from hybrid_dlrm.common.lock import DirectoryLock, LockError, LockHeld

DEAD = 2**30  # above any pid_max (2**22 at most): no such process can exist


def hold(path, pid: int) -> int:
    """`path` locked by another description, naming `pid` as its holder (as a forked child that
    inherited the lock of a process that has ended holds it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{pid}\n".encode(), 0)
    return fd


@pytest.fixture
def no_sleep(monkeypatch):
    """A wait is a failure: the old code slept forever where nobody held the lock."""

    def sleep(s):
        raise AssertionError(f"waited ({s} s)")

    monkeypatch.setattr(time, "sleep", sleep)


def test_a_lock_whose_taker_has_ended_is_one_line_naming_it_and_the_file(tmp_path, no_sleep):
    fd = hold(tmp_path / ".lock", DEAD)
    try:
        with pytest.raises(LockHeld) as e:
            DirectoryLock(tmp_path).acquire_waiting("--out-dir", poll_s=0.01)
        assert not e.value.alive and e.value.holder == DEAD
        assert str(e.value) == (
            f"--out-dir: {tmp_path / '.lock'} is held, but process {DEAD} that took it has ended "
            f"(a process it started still holds it); end that process, or remove "
            f"{tmp_path / '.lock'} if none is left"
        )
    finally:
        os.close(fd)
    DirectoryLock(tmp_path).acquire("--out-dir").release()  # free once that holder goes


def test_a_living_holder_is_waited_for_then_the_lock_is_taken(tmp_path):
    fd = hold(tmp_path / ".lock", os.getpid())  # a living process
    seen = []

    def on_wait(pid):
        seen.append(pid)
        os.close(fd)  # the holder ends while we wait

    lock = DirectoryLock(tmp_path).acquire_waiting("--out-dir", on_wait, poll_s=0.01)
    assert seen == [os.getpid()]
    assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
    lock.release()


def test_a_lock_file_that_cannot_be_made_is_one_line_not_a_wait(tmp_path, monkeypatch, no_sleep):
    real = os.open

    def read_only(path, flags, *a):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, flags, *a)

    monkeypatch.setattr(lock_module.os, "open", read_only)
    with pytest.raises(LockError) as e:
        DirectoryLock(tmp_path).acquire_waiting("--scm-dir", poll_s=0.01)
    assert not isinstance(e.value, LockHeld)
    assert str(e.value) == (
        f"--scm-dir: {tmp_path / '.lock'}: cannot make the lock file (Read-only file system); "
        "choose a place this process can write"
    )
