"""The one check of an on-disk format's header: is this our file, and a version this code reads?

Every file format of the project (datasets' meta.json, checkpoints, sharded-checkpoint indexes,
placement plans, access profiles, inference artifacts, SSD-tier manifests, perf traces,
performance models) starts with a `format` name and a `version`. `check_header` is how each
reader checks them, so a wrong file reads the same way everywhere: one line naming the file,
what it is not, or which version it has and which this code reads.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["FormatError", "check_header", "versions_text"]


class FormatError(ValueError):
    """A file that is not of the expected format or version (readers pass their own type)."""


def versions_text(versions: Collection[int]) -> str:
    """(3, 2, 1) -> '3, 2 or 1'."""
    names = [str(v) for v in versions]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_header(
    meta: Any,
    where: object,
    *,
    format: str,
    versions: Collection[int],
    what: str | None = None,
    kind: str = "format",
    error: type[Exception] = FormatError,
    format_key: str = "format",
    version_key: str = "version",
) -> int:
    """The version of `meta` (a file's header, a dict), or `error` naming `where` (the file):

        WHERE: not a WHAT (format FOUND)              -- not this format (or not a JSON object)
        WHERE: KIND version FOUND, expected 3, 2 or 1 -- this format, a version not read here

    `what` defaults to "FORMAT file"; `versions` are the ones this code reads, newest first."""
    found = meta.get(format_key) if isinstance(meta, Mapping) else None
    if found != format:
        raise error(f"{where}: not a {what or f'{format} file'} (format {found!r})")
    version = meta.get(version_key)
    if isinstance(version, bool) or version not in versions:
        raise error(f"{where}: {kind} version {version!r}, expected {versions_text(versions)}")
    return version
