"""The embeddings package's errors, in one place so callers catch them without importing the
modules that raise them (and the heavy imports those carry).

Each is a user's or a file's mistake told in one line: the CLI prints it and exits 2.
"""

from __future__ import annotations


class PlacementError(ValueError):
    """An impossible or inconsistent placement, or an unreadable placement-plan file."""


class ProfileError(ValueError):
    """Bad input to the access profiler or an unreadable profile file."""


class TierError(LookupError):
    """A row asked of a tier that does not hold it (the plan put it elsewhere)."""


class FbgemmMismatchError(ImportError):
    """fbgemm-gpu is installed but does not load with this torch (it names both versions)."""


__all__ = [
    "FbgemmMismatchError",
    "PlacementError",
    "ProfileError",
    "ScmError",
    "TierError",
    "npz_failure",
]


def npz_failure(e: BaseException) -> str:
    """Why numpy could not read an .npz file, in a few words (never its advice to unpickle: a
    file that is not an archive of plain arrays is not ours)."""
    text = str(e).strip()
    if "pickle" in text:
        return "not plain arrays: damaged, or holding Python objects, which are never loaded"
    return (text.splitlines() or [type(e).__name__])[0][:160]


class ScmError(ValueError):
    """A corrupt, truncated or mismatched SSD-tier file (or journal), or a tier that cannot be
    opened as asked: one line naming the file, the offset and what was expected."""
