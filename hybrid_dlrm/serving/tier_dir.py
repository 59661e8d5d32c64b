"""Whose `--scm-dir` is it? A tier directory belongs to one owner (a training run's tier, or the
copy of an artifact's tables a predictor serves from); a predictor writes only into one that is
its own, and checks that before a byte is written.

Its own: a directory that does not exist yet (made here), an empty one, or one that holds only
the serving tier's files (`serving.json` of the serving tier's format, `rows.dat`, and the
temporaries of its atomic writes). A training run's tier (`tier.json` of the format
"hybrid-dlrm/scm-tier", or its `journal.log`) and any other file are refused, naming them.

Known gap (embeddings/ssd/serving.py, not this package's): the serving tier removes its
`serving.json` while it copies rows in, so a directory holding `rows.dat` alone is taken as an
interrupted copy of its own; a training tier stripped of both `tier.json` and `journal.log`
would look the same. The serving tier writing its manifest (marked unfinished) before
`rows.dat` would close that.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from embeddings.ssd import serving as scm_serving
from embeddings.ssd import tier as scm_tier
from hybrid_dlrm.common.header import check_header
from hybrid_dlrm.serving.artifact import ArtifactError

_OWN = {scm_serving.MANIFEST, scm_serving.ROWS}


def _error(where: Path, what: str) -> ArtifactError:
    return ArtifactError(f"--scm-dir {where}: {what}")


def _training_owner(manifest: Path) -> str:
    try:
        meta = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return ""
    if isinstance(meta, dict) and meta.get("format") == scm_tier.FORMAT:
        return f" in {meta['owner']}" if meta.get("owner") else ""
    return ""


def claim(directory: str | Path) -> Path:
    """`directory`, made if missing, when it is the serving tier's own; ArtifactError naming the
    flag, the directory and what is there otherwise."""
    d = Path(directory)
    if d.is_symlink() and not d.exists():
        raise _error(d, "a broken symbolic link")
    if d.exists() and not d.is_dir():
        raise _error(d, "not a directory (expected a directory for the SSD tier, made if missing)")
    if not d.exists():
        for parent in d.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise _error(d, f"{parent} is a file, not a directory")
                break
        try:
            d.mkdir(parents=True)
        except OSError as e:
            raise _error(d, f"cannot be made ({e.strerror or e})") from None
        return d
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        raise _error(d, f"cannot be read ({e.strerror or e})") from None
    if scm_tier.MANIFEST in names or scm_tier.JOURNAL in names:
        owner = _training_owner(d / scm_tier.MANIFEST)
        raise _error(
            d, f"holds the SSD tier of the training run{owner} (tier.json, journal.log); a "
            "predictor serves only from a directory of its own: give it another one"
        )  # fmt: skip
    foreign = [
        n for n in names if n not in _OWN and not n.startswith(f".{scm_serving.MANIFEST}.tmp-")
    ]
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise _error(
            d, f"holds files that are not the serving tier's ({shown}); give the predictor an "
            "empty directory or one it made"
        )  # fmt: skip
    if scm_serving.MANIFEST in names:
        try:
            meta = json.loads((d / scm_serving.MANIFEST).read_text())
            check_header(meta, d / scm_serving.MANIFEST, format=scm_serving.FORMAT, versions=(scm_serving.VERSION,),
                         what="serving tier manifest", error=ArtifactError)  # fmt: skip
        except (OSError, ValueError) as e:
            raise _error(d, f"serving.json is not the serving tier's ({e})") from None
    return d
