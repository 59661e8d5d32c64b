"""The one way a file reaches its final name: written whole beside it, then renamed over it.

A file is written to a temporary in the same directory (by default `.NAME.tmp-PID`: hidden, and
named after its writer so a later run can tell a crashed writer's leftover from a live one's),
flushed and fsynced, renamed over `NAME` with `os.replace`, and the directory is fsynced so the
rename itself survives a power cut. A crash at any point leaves the old `NAME` (or none) and at
most a temporary, never a half-written `NAME`.

    with atomic_write(path) as f:        # streamed writes (torch.save, np.savez, rows in blocks)
        torch.save(obj, f)
    write_json(path, obj)                # whole bytes / text / JSON
    AtomicFile(path)                     # a writer kept open across calls: .file, commit(), abort()
    publish(tmp, path)                   # a finished file or directory made by other means

Errors are the file system's own OSErrors; each caller turns them into its one-line error
(a full disk named by its mount point) as before.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["AtomicFile", "atomic_write", "fsync_dir", "publish", "temporary", "write_bytes",
           "write_json", "write_text"]  # fmt: skip


def temporary(path: str | Path) -> Path:
    """The default temporary of `path`: hidden, in the same directory, named after this process."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_dir(directory: str | Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: str | Path, path: str | Path) -> None:
    """Rename the complete `tmp` (a file or a directory, already synced) over `path` (a file, or
    an empty directory) and make the rename durable. The only rename into place in the tree."""
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


class AtomicFile:
    """A file open for writing at its temporary; `commit()` publishes it, `abort()` removes it."""

    def __init__(self, path: str | Path, mode: str = "wb", tmp: str | Path | None = None) -> None:
        if "w" not in mode:
            raise ValueError(f"AtomicFile writes a new file: mode {mode!r} has no 'w'")
        self.path = Path(path)
        self.tmp = Path(tmp) if tmp is not None else temporary(self.path)
        self.file: IO[Any] = open(self.tmp, mode)

    def commit(self) -> None:
        try:
            self.file.flush()  # buffered bytes reach the file system here: a full disk shows now
            os.fsync(self.file.fileno())
            self.file.close()
            publish(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        try:
            self.file.close()  # flushes what is buffered: fails again on a full disk
        except OSError:
            pass
        finally:
            self.tmp.unlink(missing_ok=True)


@contextmanager
def atomic_write(
    path: str | Path, mode: str = "wb", tmp: str | Path | None = None
) -> Iterator[IO[Any]]:
    """The file to write `path`'s new contents to; published when the block ends without an
    exception, removed when it raises."""
    f = AtomicFile(path, mode, tmp)
    try:
        yield f.file
    except BaseException:
        f.abort()
        raise
    f.commit()


def write_bytes(path: str | Path, data: bytes, tmp: str | Path | None = None) -> None:
    with atomic_write(path, "wb", tmp) as f:
        f.write(data)


def write_text(path: str | Path, text: str, tmp: str | Path | None = None) -> None:
    write_bytes(path, text.encode(), tmp)


def write_json(
    path: str | Path, obj: Any, tmp: str | Path | None = None, indent: int | None = 1, **dumps
) -> None:
    """`obj` as JSON and a newline (`indent=1` unless told; other `json.dumps` options pass on)."""
    write_text(path, json.dumps(obj, indent=indent, **dumps) + "\n", tmp)
