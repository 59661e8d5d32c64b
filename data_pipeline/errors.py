"""The one exception type for bad data or bad data options, and the record of a rejected line.

Its message is a single line naming the file (and line, where there is one) and what was expected;
the CLI prints it and exits with code 2.
"""

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path


class DataError(ValueError):
    pass


def mount_point(directory: Path) -> Path:
    """The mount point of the file system holding `directory` (what a full disk is named by)."""
    directory = Path(directory).resolve()
    while not os.path.ismount(directory):
        directory = directory.parent
    return directory


def unwritable_dir(path: Path) -> str | None:
    """Why `path` is not, and cannot be made, a directory this process can write; None if it
    is or can be. Checked before work that would write there, so a mistake costs seconds."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a directory"
    base = path.absolute()
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        return f"{path} cannot be created: {base} is a file"
    if not os.access(base, os.W_OK | os.X_OK):  # a read-only file system fails this too
        return f"{path} cannot be written: {base} is not writable"
    return None


def write_error(e: OSError, path: Path, what: str) -> DataError:
    """One line for a failed write of `path`: a full file system named by its mount point."""
    path = Path(path)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(path.parent).free
        return DataError(
            f"{path}: no space left on the file system mounted at {mount_point(path.parent)} "
            f"while writing {what} ({free // 1024} KiB free); the files finished before are intact"
        )
    return DataError(f"{path}: could not write {what} ({e.strerror or e})")


def numpy_failure(e: Exception) -> str:
    """Why numpy could not open an `.npy` file, in a few words, never its advice to unpickle: a
    file that does not hold plain numbers (its header damaged, say) is not ours to trust."""
    text = " ".join(str(e).split())
    if "pickle" in text:
        return "its header is damaged, or it holds Python objects, which are never loaded"
    return text[:200] or type(e).__name__


@dataclass
class BadLine:
    """A rejected raw line: its 0-based index in the parsed block, why, and a one-line message."""

    index: int
    reason: str
    message: str
