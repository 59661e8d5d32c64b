"""Where `hybrid_dlrm.serving.predict` writes: `--out` checked so that nothing already there is destroyed
by mistake, and the CSV written whole or not at all.

`--out` follows the output rule every command shares (hybrid_dlrm/common/outputs.py): an existing
file is refused unless `--overwrite` (a CSV carries no mark of who wrote it); the input, the
artifact and the SSD tier are never written over, whatever the name (resolved paths, and device
and inode for hard links); anything not a regular file (a symbolic link, a device such as
/dev/null, a FIFO, a directory) is refused, with `--overwrite` too. `-` is stdout. The
file is written beside its name and renamed over it at the end (hybrid_dlrm/common/atomic.py); a failed
write (a full disk names its mount point) removes the temporary and keeps what was there.
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

from data_pipeline.errors import DataError, mount_point
from hybrid_dlrm.common.atomic import AtomicFile
from hybrid_dlrm.common.outputs import Purpose, check_output

PREDICTIONS_CSV = Purpose("predictions CSV")  # no identity: an existing file needs --overwrite


def check_out(out: str, overwrite: bool, protected: dict[str, Path]) -> Path | None:
    """The file `--out` names (None: stdout), or ConfigError by the output rule
    (hybrid_dlrm/common/outputs.py): an existing file without `overwrite`, anything but a
    regular file, or any of `protected` (flag -> the input, the artifact, the tier: files or
    directories, by resolved path and by device and inode)."""
    from dlrm.errors import ConfigError

    if out == "-":
        return None
    path = check_output(
        out, "--out", PREDICTIONS_CSV, protected=protected, overwrite=overwrite, error=ConfigError
    )
    if not path.parent.is_dir():  # the CSV's writer makes no directories
        raise ConfigError(f"--out: {path.parent} does not exist")
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
