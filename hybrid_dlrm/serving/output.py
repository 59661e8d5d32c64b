"""Where `hybrid_dlrm.serving.predict` writes: `--out` checked so that nothing already there is destroyed
by mistake, and the CSV written whole or not at all.

An existing `--out` is refused unless `--overwrite`; the input, the artifact and the SSD tier are
never written over, whatever the name (resolved paths, and device and inode for hard links);
anything not a regular file (a symbolic link, a device such as /dev/null, a FIFO, a directory) is
refused, with `--overwrite` too: replacing it would replace the node itself. `-` is stdout. The
file is written beside its name and renamed over it at the end (hybrid_dlrm/common/atomic.py); a failed
write (a full disk names its mount point) removes the temporary and keeps what was there.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

from data_pipeline.errors import DataError, mount_point
from hybrid_dlrm.common.atomic import AtomicFile

_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory",
          stat.S_IFLNK: "a symbolic link"}  # fmt: skip


def check_out(out: str, overwrite: bool, protected: dict[str, Path]) -> Path | None:
    """The file `--out` names (None: stdout), or ConfigError when writing it could destroy
    something: an existing file without `overwrite`, anything but a regular file, or any of
    `protected` (flag -> the input, the artifact, the tier: files or directories, by resolved
    path and by device and inode)."""
    from dlrm.errors import ConfigError

    if out == "-":
        return None
    path = Path(out)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ConfigError(f"--out: {path}: cannot be examined ({e.strerror or e})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise ConfigError(f"--out: {path} is {kind}; expected a CSV file name (or - for stdout)")
    if not path.parent.is_dir():
        raise ConfigError(f"--out: {path.parent} does not exist")
    target = path.parent.resolve() / path.name
    inodes = {(st.st_dev, st.st_ino)} if st is not None else set()
    for flag, p in protected.items():
        if not p.exists():
            continue
        rp = p.resolve()
        files = [f for f in rp.rglob("*") if f.is_file()] if rp.is_dir() else [rp]
        if (
            target == rp
            or rp in target.parents
            or any((f.stat().st_dev, f.stat().st_ino) in inodes for f in files)
        ):
            what = "is" if rp.is_file() else "is inside"
            raise ConfigError(
                f"--out: {path} {what} {flag} {p}, which is never written over; choose another name"
            )
    if st is not None and not overwrite:
        raise ConfigError(
            f"--out: {path} already exists; pass --overwrite to replace it, or choose another name"
        )
    return path


class CsvOutput:
    """The CSV, written to a temporary file renamed over `path` at the end (None: stdout)."""

    def __init__(self, path: Path | None, header: str) -> None:
        self.path = path
        self.out = None
        self.rows = 0
        try:
            if path is None:
                self.f = sys.stdout.buffer
            else:
                self.out = AtomicFile(path)
                self.f = self.out.file
            self.f.write(header.encode() + b"\n")
        except OSError as e:
            raise self._error(e) from None

    def _error(self, e: OSError) -> DataError:
        """The one line for a failed write; the temporary is removed."""
        self.abort()
        where = self.path or "stdout"
        if e.errno in (errno.ENOSPC, errno.EDQUOT) and self.path is not None:
            return DataError(
                f"{where}: no space left on the file system mounted at "
                f"{mount_point(self.path.parent)}; nothing kept"
            )
        return DataError(f"{where}: cannot be written ({e.strerror or e}); nothing kept")

    def write(self, data: bytes, rows: int) -> None:
        try:
            self.f.write(data)
        except OSError as e:
            raise self._error(e) from None
        self.rows += rows

    def finish(self) -> None:
        try:
            if self.out is None:
                self.f.flush()
            else:
                self.out.commit()
        except OSError as e:
            raise self._error(e) from None

    def abort(self) -> None:
        if self.out is not None:
            self.out.abort()
