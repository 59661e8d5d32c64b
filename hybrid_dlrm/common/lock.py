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
from pathlib import Path

_held: dict[tuple[int, int, str], list] = {}  # (device, inode, name) -> [fd, holders]
_guard = threading.Lock()


class LockError(Exception):
    """The directory is held by another process (or the lock file cannot be made)."""


class DirectoryLock:
    """`DirectoryLock(path).acquire(flag)`: hold `path` (created if missing) or raise LockError
    naming `flag`, the directory and the holder's process id."""

    def __init__(self, directory: str | Path, name: str = ".lock") -> None:
        self.dir, self.name = Path(directory), name
        self._key: tuple[int, int, str] | None = None

    def acquire(self, flag: str) -> DirectoryLock:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            st = os.stat(self.dir)
        except OSError as e:
            raise LockError(f"{flag}: {self.dir}: cannot be used ({e.strerror or e})") from None
        key = (st.st_dev, st.st_ino, self.name)
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
                    f"{flag}: {path}: cannot make the lock file ({e.strerror})"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise LockError(
                    f"{flag}: {self.dir} is in use by another process (process {holder}); wait "
                    "for it to end or choose another directory"
                ) from None
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass  # the pid is only for the message; a full disk must not fail the lock
            _held[key] = [fd, 1]
            self._key = key
        return self

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
