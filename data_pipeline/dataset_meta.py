"""The on-disk contract of a preprocessed Criteo directory: names, markers, meta.json.

    DIR/options.json          what is being made (written first; a rerun must match it)
    DIR/day_N.labels.npy      int8 [rows]           (absent for the unlabelled `inference` part)
    DIR/day_N.dense.npy       float32 [rows, 13]    log(max(x, 0) + 1), empty = 0
    DIR/day_N.sparse.npy      int32|int64 [rows, 26] row ids (int32 when every table fits)
    DIR/day_N.done.json       marker: rows, lines, bad lines, size and CRC-32 of each file
    DIR/vocab/                frequency mode: the id maps (see categorical.Vocabulary)
    DIR/meta.json             written last: the dataset is complete

All JSON, all `.npy` (no pickle). A part counts as done only when its marker exists, matches
options.json, and its files match the marker; anything else is redone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybrid_dlrm.common import atomic
from hybrid_dlrm.common.header import check_header

from .errors import DataError, write_error
from .npy_stream import check_file

FORMAT = "hybrid-dlrm/criteo-columns"
FORMAT_VERSION = 1
COLUMNS = ("labels", "dense", "sparse")


def column_path(out: Path, part: str, column: str) -> Path:
    return out / f"{part}.{column}.npy"


def marker_path(out: Path, part: str) -> Path:
    return out / f"{part}.done.json"


def temporary(path: Path) -> Path:
    """Where a file of a dataset directory is written before its rename: `NAME.tmp`, which the
    next preprocessing run removes as an interrupted one's leftover."""
    return path.with_name(path.name + ".tmp")


def write_json(path: Path, obj: Any) -> None:
    """Atomically (hybrid_dlrm.common.atomic), or one DataError naming the file."""
    try:
        atomic.write_json(path, obj, temporary(path))
    except OSError as e:
        raise write_error(e, path, "a record of the preprocessing") from None


def read_json(path: Path) -> dict:
    """A JSON object this package wrote; anything else (damaged, cut short, binary, a list) is
    one DataError naming the file."""
    try:
        obj = json.loads(Path(path).read_bytes())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not valid JSON (not UTF-8 text)") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: damaged (a JSON {type(obj).__name__}, expected an object)")
    return obj


def part_problem(out: Path, part: str, fingerprint: dict, full: bool) -> str | None:
    """Why part is not complete and valid (None if it is)."""
    marker = marker_path(out, part)
    if not marker.is_file():
        return "not written yet"
    try:
        record = read_json(marker)
    except DataError as e:
        return str(e)
    if record.get("fingerprint") != fingerprint:
        return "made with other options"
    for column, file_record in record.get("files", {}).items():
        problem = check_file(column_path(out, part, column), file_record, full)
        if problem:
            return problem
    return None


def describe_difference(old: Any, new: Any, prefix: str = "") -> str:
    """The first differing setting, as 'name: old there, new asked' (one short line)."""
    if isinstance(old, dict) and isinstance(new, dict):
        # in the order the settings are written (what was asked for first), not sorted: a
        # setting that only applies with another (sub_sample_rate's seed) comes after it
        for key in [*new, *(k for k in old if k not in new)]:
            found = describe_difference(old.get(key), new.get(key), f"{prefix}{key}.")
            if found:
                return found
        return ""
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = describe_difference(a, b, f"{prefix.rstrip('.')}[{i}].")
            if found:
                return found
        return ""
    if old != new:

        def short(x: Any) -> str:
            text = repr(x)
            return text if len(text) <= 60 else text[:57] + "..."

        return f"{prefix.rstrip('.')}: {short(old)} there, {short(new)} asked"
    return ""


def check_bad_line_policy(where: str, skipped: int, on_bad_line: str) -> None:
    """Output made while skipping malformed lines is not what `error` would accept."""
    if skipped and on_bad_line == "error":
        raise DataError(
            f"{where}: was made with --on-bad-line skip and skipped {skipped} malformed lines; "
            f"pass --on-bad-line skip to use it, or delete it to re-check the raw data"
        )


def load_meta(directory: str | Path) -> dict:
    """meta.json of a complete preprocessed directory, validated enough to load it."""
    path = Path(directory) / "meta.json"
    if not path.is_file():
        raise DataError(
            f"{path}: not found (not a preprocessed Criteo directory, or preprocessing did not finish)"
        )
    meta = read_json(path)
    check_header(meta, path, format=FORMAT, versions=(FORMAT_VERSION,), kind="data set format",
                 what="preprocessed Criteo data set", error=DataError, version_key="format_version")  # fmt: skip
    return meta
