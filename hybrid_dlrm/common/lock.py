"""One process at a time in a directory: an advisory `fcntl.flock` on a lock file inside it.

Two runs writing the same run directory or SSD tier would each take the other's files for its
own and both end with wrong models (issue 37). flock is released by the kernel when its holder
exits, however it exits (kill -9 included), so a lock is never left stuck; the file keeps the
holder's process id only to name it in the refusal. Within one process the lock is re-entrant
(tools and tests build a second run on a directory they already hold): it guards against other
processes, which is where the damage comes from.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

_held: dict[tuple, list] = {}  # (device, inode, name[, holder]) -> [fd, holders]
_guard = threading.Lock()


class LockError(Exception):
    """The directory is held by another process (LockHeld), or the lock file cannot be made."""


class LockHeld(LockError):
    """Another process holds the lock: `holder` is the process id its file names (None when it
    names none), `alive` whether that process still runs on this machine."""

    def __init__(self, message: str, holder: int | None, alive: bool) -> None:
        super().__init__(message)
        self.holder, self.alive = holder, alive


def alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


class DirectoryLock:
    """`DirectoryLock(path).acquire(flag)`: hold `path` (created if missing) or raise LockError
    naming `flag`, the directory and the holder's process id. `reentrant=False`: this object's
    own hold, which other threads of this process wait for too (callers of preprocessing on
    several threads share one result as processes do)."""

    def __init__(self, directory: str | Path, name: str = ".lock", reentrant: bool = True) -> None:
        self.dir, self.name, self.reentrant = Path(directory), name, reentrant
        self._key: tuple | None = None

    def acquire(self, flag: str) -> DirectoryLock:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            st = os.stat(self.dir)
        except OSError as e:
            raise LockError(f"{flag}: {self.dir}: cannot be used ({e.strerror or e})") from None
        key = (st.st_dev, st.st_ino, self.name) + (() if self.reentrant else (id(self),))
        with _guard:
            if key in _held:
                _held[key][1] += 1
                self._key = key
                return self
            path = self.dir / self.name
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise LockError(
                    f"{flag}: {path}: cannot make the lock file ({e.strerror}); "
                    "choose a place this process can write"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                text = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                pid = _holder(text)
                if pid is not None and not alive(pid):
                    raise LockHeld(
                        f"{flag}: {path} is held, but process {pid} that took it has ended (a "
                        "process it started still holds it); end that process, or remove "
                        f"{path} if none is left",
                        pid, False,
                    ) from None  # fmt: skip
                raise LockHeld(
                    f"{flag}: {self.dir} is in use by another process (process "
                    f"{text or 'unknown'}); wait for it to end or choose another directory",
                    pid, True,
                ) from None  # fmt: skip
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass  # the pid is only for the message; a full disk must not fail the lock
            _held[key] = [fd, 1]
            self._key = key
        return self

    def acquire_waiting(
        self, flag: str, on_wait: Callable[[int | None], None] | None = None, poll_s: float = 1.0
    ) -> DirectoryLock:
        """`acquire`, waiting while another living process holds the lock (`on_wait(pid)` once,
        as the wait starts); anything else (a holder that has ended, a lock file that cannot be
        made) raises its LockError at once."""
        waited = False
        while True:
            try:
                return self.acquire(flag)
            except LockHeld as e:
                if not e.alive:
                    raise
                if not waited and on_wait is not None:
                    on_wait(e.holder)
                waited = True
            time.sleep(poll_s)

    def release(self) -> None:
        with _guard:
            if self._key is None or self._key not in _held:
                return
            entry = _held[self._key]
            entry[1] -= 1
            if entry[1] == 0:
                os.close(entry[0])  # closing the last descriptor drops the flock
                del _held[self._key]
            self._key = None
