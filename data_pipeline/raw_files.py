"""Where the raw Criteo lines are, and reading them in whole-line blocks.

Layouts (facebookresearch/dlrm conventions):

- Kaggle: one `train.txt`, cut by line count into 7 near-equal pseudo-days (the first
  `total % 7` days get one line more). Days 0-5 train; day 6 is split by row: its first half
  (ceil) is the test set, the second half validation. (torchrec's Kaggle recipe uses the
  opposite halves; we follow the reference so results compare with its papers.) An optional
  unlabelled `test.txt` (39 fields) becomes the `inference` part.
- Terabyte: `day_0` .. `day_23`, each plain or `.gz` (plain wins if both exist). Days 0-22 train;
  day 23 is split test/validation like Kaggle's day 6.

A part is read as blocks of whole lines (each ends with a newline; a last line without one gets
it added), with the file offset of each block so that per-line decisions (down-sampling) do not
depend on how the file was cut into blocks.
"""

from __future__ import annotations

import bisect
import gzip
import mmap
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hybrid_dlrm.common.crc import crc32

from .errors import DataError

KAGGLE_DAYS = 7
TERABYTE_DAYS = 24
_STEP = 1 << 20  # line-count checkpoints, so finding a day boundary reads at most ~1 MB
_WINDOW = 1 << 26  # bytes mapped at once while counting lines (a multiple of the page size)


@dataclass(frozen=True)
class RawPart:
    """A run of lines that becomes one output part (a day, or the unlabelled Kaggle test)."""

    name: str  # "day_0", ..., "inference"
    path: Path
    byte_start: int = 0
    byte_end: int | None = None  # None: to the end of the file
    first_line: int = 1  # line number (1-based, within the file) of the first line
    num_lines: int | None = None  # known for Kaggle pseudo-days
    has_label: bool = True
    train: bool = False  # a training day: negative down-sampling applies

    @property
    def compressed(self) -> bool:
        return self.path.suffix == ".gz"

    def size(self) -> int:
        """Bytes this part reads from disk (compressed bytes for .gz)."""
        end = self.path.stat().st_size if self.byte_end is None else self.byte_end
        return end - self.byte_start


@dataclass
class Block:
    """Whole lines: in `data`, or (plain files) the byte range [offset, end) of `path`, which the
    worker reads itself so the bytes are not also read and piped by the main process."""

    data: bytearray | None
    offset: int  # offset of the first byte in the (uncompressed) file
    consumed: int  # bytes read from disk so far in this part, for progress
    end: int = 0
    path: Path | None = None

    def lines(self) -> bytearray:
        return self.data if self.data is not None else read_range(self.path, self.offset, self.end)


def read_range(path: Path | str, start: int, end: int) -> bytearray:
    """Bytes [start, end) of a plain file, with a newline added at the end if missing (the
    last line of a file need not have one)."""
    buf = bytearray(end - start)
    try:
        with open(path, "rb") as f:
            f.seek(start)
            got = f.readinto(buf)
    except OSError as e:
        raise DataError(f"{path}: unreadable ({e})") from None
    if got != len(buf):
        raise DataError(f"{path}: changed while being read ({got} of {len(buf)} bytes at {start})")
    if buf and not buf.endswith(b"\n"):
        buf += b"\n"
    return buf


def iter_blocks(part: RawPart, block_bytes: int = 8 << 20) -> Iterator[Block]:
    """The part's lines in blocks of about block_bytes, each cut after a newline.

    Plain files: only the cut points are found here (a few KB read per block); the bytes are
    read by whoever parses the block. Gzip files: decompressed here into fresh bytearrays
    (readinto, so each byte is copied once). An unreadable or corrupt file raises DataError."""
    try:
        if part.compressed:
            yield from _blocks(part, block_bytes)
        else:
            yield from _ranges(part, block_bytes)
    except (OSError, EOFError, zlib.error) as e:
        what = "a truncated or corrupt gzip file" if part.compressed else "unreadable"
        raise DataError(f"{part.path}: {what} ({e})") from None


def _ranges(part: RawPart, block_bytes: int) -> Iterator[Block]:
    end = part.path.stat().st_size if part.byte_end is None else part.byte_end
    pos = part.byte_start
    with open(part.path, "rb") as f:
        while pos < end:
            cut, target = end, pos + block_bytes
            while target < end:  # the first newline at or after target ends the block
                f.seek(target)
                chunk = f.read(min(1 << 16, end - target))
                i = chunk.find(b"\n")
                if i >= 0:
                    cut = target + i + 1
                    break
                target += len(chunk)
            yield Block(None, pos, cut - part.byte_start, cut, part.path)
            pos = cut


def _blocks(part: RawPart, block_bytes: int) -> Iterator[Block]:
    with open(part.path, "rb") as disk:
        f = gzip.GzipFile(fileobj=disk, mode="rb") if part.compressed else disk
        try:
            f.seek(part.byte_start)
            remaining = None if part.byte_end is None else part.byte_end - part.byte_start
            offset = part.byte_start
            carry = b""
            while True:
                want = block_bytes if remaining is None else min(block_bytes, remaining)
                buf = bytearray(len(carry) + want)
                buf[: len(carry)] = carry
                got = f.readinto(memoryview(buf)[len(carry) :]) if want > 0 else 0
                if remaining is not None:
                    remaining -= got
                consumed = disk.tell() - part.byte_start
                if got == 0:
                    if carry:
                        del buf[len(carry) :]
                        if not buf.endswith(b"\n"):
                            buf += b"\n"
                        yield Block(buf, offset, consumed)
                    return
                end = len(carry) + got
                cut = buf.rfind(b"\n", 0, end) + 1
                if cut == 0:  # no newline yet: a very long line, keep reading
                    carry = bytes(buf[:end])
                    continue
                carry = bytes(buf[cut:end])
                del buf[cut:]
                yield Block(buf, offset, consumed)
                offset += cut
        finally:
            if f is not disk:
                f.close()


def _count_lines(path: Path) -> tuple[int, list[tuple[int, int]]]:
    """Lines in a plain file, and (byte offset, newlines before it) every _STEP bytes."""
    try:
        return _count_lines_unchecked(path)
    except OSError as e:
        raise DataError(f"{path}: unreadable ({e})") from None


def _count_lines_unchecked(path: Path) -> tuple[int, list[tuple[int, int]]]:
    checkpoints: list[tuple[int, int]] = []
    size = path.stat().st_size
    if size == 0:
        return 0, [(0, 0)]
    lines = 0
    last = 10
    # Memory-mapped a window at a time: one pass, no copy out of the page cache, and no more
    # than a window's pages mapped (so the process's resident size stays small).
    with open(path, "rb") as f:
        for start in range(0, size, _WINDOW):
            length = min(_WINDOW, size - start)
            with mmap.mmap(f.fileno(), length, offset=start, access=mmap.ACCESS_READ) as m:
                data = np.frombuffer(m, dtype=np.uint8)
                for i in range(0, length, _STEP):
                    checkpoints.append((start + i, lines))
                    lines += int(np.count_nonzero(data[i : i + _STEP] == 10))
                last = int(data[-1])
                del data  # the mmap cannot close while numpy still looks at it
    if last != 10:
        lines += 1  # a last line without its newline still counts
    return lines, checkpoints


def _offset_of_line(path: Path, line_index: int, checkpoints: list[tuple[int, int]]) -> int:
    """Byte offset where 0-based line `line_index` starts."""
    if line_index == 0:
        return 0
    # The last checkpoint with fewer newlines before it: the line starts after it.
    k = bisect.bisect_left(checkpoints, line_index, key=lambda c: c[1]) - 1
    offset, before = checkpoints[k]
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read(_STEP)
            newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
            need = line_index - before  # newlines to pass (>= 1)
            if need <= len(newlines):
                return offset + int(newlines[need - 1]) + 1
            before += len(newlines)
            offset += len(chunk)


def kaggle_day_sizes(total_lines: int, days: int = KAGGLE_DAYS) -> list[int]:
    """Lines per pseudo-day: near-equal, the first `total % days` days one line longer."""
    base, extra = divmod(total_lines, days)
    return [base + (1 if d < extra else 0) for d in range(days)]


def split_halves(rows: int) -> tuple[int, int]:
    """(test rows, validation rows) of the last day: test is the first ceil(rows / 2)."""
    test = (rows + 1) // 2
    return test, rows - test


def _file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: not found (expected {what})")
    return path


def kaggle_files(raw: Path, test_raw: Path | None) -> tuple[Path, Path | None]:
    """train.txt (raw may be the file or its directory) and the optional test.txt."""
    train = raw / "train.txt" if raw.is_dir() else raw
    _file(train, "the Kaggle train.txt, or a directory holding it")
    if train.suffix == ".gz":
        raise DataError(f"{train}: the Kaggle train.txt must be uncompressed (it is cut by line)")
    test = _file(test_raw, "the unlabelled Kaggle test.txt") if test_raw is not None else None
    return train, test


def terabyte_files(raw: Path, days: int = TERABYTE_DAYS) -> list[Path]:
    """day_0 .. day_{days-1}, plain or .gz; raw is their directory or the prefix `DIR/day`."""
    prefix = raw / "day" if raw.is_dir() else raw
    files = []
    for d in range(days):
        plain = prefix.with_name(f"{prefix.name}_{d}")
        gz = plain.with_name(plain.name + ".gz")
        if plain.is_file():
            files.append(plain)
        elif gz.is_file():
            files.append(gz)
        else:
            raise DataError(
                f"{plain}: not found, nor {gz.name} (expected day_0 .. day_{days - 1}, plain or .gz)"
            )
        _check_not_empty(files[-1])
    return files


def _check_not_empty(path: Path) -> None:
    """A day without a line is a truncated download, not an empty day: taken as one, the last
    day would leave the test split empty and the run would fail after a whole epoch."""
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as f:
                empty = f.read(1) == b""
        except (OSError, EOFError) as e:
            raise DataError(f"{path}: not a readable gzip file ({e})") from None
    else:
        empty = path.stat().st_size == 0
    if empty:
        raise DataError(f"{path}: empty: every Terabyte day holds that day's lines")


def kaggle_parts(train: Path, test: Path | None) -> list[RawPart]:
    total, checkpoints = _count_lines(train)
    if total < KAGGLE_DAYS:
        raise DataError(f"{train}: {total} lines; expected at least {KAGGLE_DAYS} (one per day)")
    parts = []
    first = 0
    for d, n in enumerate(kaggle_day_sizes(total)):
        start = _offset_of_line(train, first, checkpoints)
        end = _offset_of_line(train, first + n, checkpoints) if d < KAGGLE_DAYS - 1 else None
        parts.append(
            RawPart(f"day_{d}", train, start, end, first + 1, n, True, d < KAGGLE_DAYS - 1)
        )
        first += n
    if test is not None:
        parts.append(RawPart("inference", test, has_label=False))
    return parts


def terabyte_parts(files: list[Path]) -> list[RawPart]:
    last = len(files) - 1
    return [RawPart(f"day_{d}", p, train=d < last) for d, p in enumerate(files)]


# --- what a preprocessed result is tied to ----------------------------------------------------

_EDGE = 1 << 20  # bytes at each end of a raw file whose CRC-32 ties a result to its content
WHOLE_FILE_BYTES = 64 << 20  # files up to this size are checksummed whole (< 0.1 s from disk)
_CHECKS = {"bytes": "size", "edges_crc32": "CRC-32 of the first and last MiB",
           "crc32": "CRC-32 of the whole file"}  # fmt: skip


def raw_identity(path: Path) -> dict:
    """What a result made from `path` is tied to: its size, the CRC-32 of its first and last MiB,
    and for a file up to 64 MiB the CRC-32 of all of it (moving the file is fine; other content
    of the same size is not). Reading every byte of a large file again would cost a pass over up
    to a terabyte at every reuse."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(_EDGE)
        edges = crc32(head)
        if size > _EDGE:
            fh.seek(max(_EDGE, size - _EDGE))
            edges = crc32(fh.read(_EDGE), edges)
        entry = {"bytes": size}
        if size <= WHOLE_FILE_BYTES:
            fh.seek(0)
            whole = 0
            while chunk := fh.read(1 << 24):
                whole = crc32(chunk, whole)
            entry["crc32"] = whole
        # after the whole file's: a refusal names the first check that differs, in this order
        entry["edges_crc32"] = edges
    return entry


def comparable_identity(recorded: dict | int, now: dict) -> dict | int:
    """`now` cut to what `recorded` holds: results made by earlier versions recorded less (a bare
    size, or no whole-file CRC-32), and only that can be compared with them."""
    if isinstance(recorded, int):
        return now["bytes"]
    if not isinstance(recorded, dict):
        return now
    return {k: now[k] for k in recorded if k in now}


def identity_checks(recorded: dict | int) -> str:
    """Which checks comparing with `recorded` makes, in words (logged at every reuse)."""
    if isinstance(recorded, int):
        return "size only (made before content checksums)"
    names = [
        text for key, text in _CHECKS.items() if isinstance(recorded, dict) and key in recorded
    ]
    return ", ".join(names) or "nothing"
