"""The inference artifact: a directory a model is served from, which cannot run code when loaded.

    ARTIFACT/manifest.json          what it is (below), with the SHA-256 of every other file,
                                    sealed: its body and the CRC-32 of the body (common/manifest)
    ARTIFACT/tables/<table>.npy     uint8 [rows, row bytes]: the table at its precision
                                    (embeddings/quantized.py has the row layout)
    ARTIFACT/dense/<name>.npy       the dense weights (hybrid_dlrm/serving/model_tensors.py: int8 layers as
                                    codes + per-channel scales, bf16 stored as uint16 bits)
    ARTIFACT/mapping/cat_N.sorted_values.npy, cat_N.sorted_ids.npy
                                    frequency-mode (or renumbered hash-mode) categorical maps (raw
                                    value -> row id), the
                                    layout data_pipeline/categorical.Vocabulary reads
    ARTIFACT/sensitivity.json, sensitivity.png   with --emb-precision auto

The manifest (JSON) holds the format version, the architecture, the feature names, every table's
size and precision, every layer's precision, the calibration metrics, the categorical mapping's
parameters, the SHA-256 of the source checkpoint, and per file its SHA-256, size, dtype and shape.
Only `.npy` (read with `allow_pickle=False`) and JSON: no pickle anywhere. The manifest is
`{"format", "format_version", "body", "crc32"}`: every value the results depend on (the hashing
modulus, a table's rows or precision) is covered, so an edited manifest is refused, never served.
Version 1 manifests carried no checksum: they are refused with "re-export" (not served read-only
with a warning: one edited value there silently changes every prediction).

`load` checks every listed file before returning anything: present, of its recorded size (a
truncated file), of its SHA-256 (a changed byte), of the dtype and shape in the manifest, and
those shapes against the architecture (a mismatched table). Any fault is one `ArtifactError` line
naming the file. SHA-256 rather than the checkpoints' CRC-32: an artifact is what gets deployed
and copied between machines, and its manifest's hashes identify exactly which model serves; the
cost is one hashing pass at load, files on parallel threads (hashlib releases the GIL).

Writing goes to a temporary sibling directory that is renamed into place at the end, so a
failed export leaves no half artifact and never touches an existing one.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from data_pipeline.errors import mount_point
from embeddings.config import TableSpec
from embeddings.quantized import check_precision, row_bytes
from hybrid_dlrm.common.atomic import publish
from hybrid_dlrm.common.header import check_header
from hybrid_dlrm.common.manifest import (
    Damaged,
    seal,
    sha256_file,  # noqa: F401 (tests import it from here)
    unseal,
)
from hybrid_dlrm.common.manifest import digests as file_digests
from hybrid_dlrm.common.outputs import Purpose, check_output

FORMAT = "hybrid-dlrm-inference-artifact"
VERSION = 2  # 1: the manifest unsealed
MANIFEST = "manifest.json"


class ArtifactError(ValueError):
    """A missing, damaged or mismatched artifact, or one that cannot be written: one line
    naming the file."""


# --- tensors as .npy --------------------------------------------------------------------------


def _to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str]:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, named in the manifest
        return t.view(torch.uint16).numpy(), "bfloat16"
    return t.numpy(), str(t.dtype).removeprefix("torch.")


def _from_numpy(a: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def _file_name(key: str) -> str:
    return key.replace("/", "_") + ".npy"


# --- writing --------------------------------------------------------------------------------------


# what quantize's --out makes (hybrid_dlrm/common/outputs.py): a new or empty directory; an
# artifact is never replaced in place (a Predictor may be serving it)
ARTIFACT_DIRECTORY = Purpose("artifact directory", directory=True)


class ArtifactWriter:
    """Collects tensors and files in a temporary directory; `finish(manifest)` hashes them,
    writes the manifest and renames the directory into place."""

    def __init__(self, out: Path) -> None:
        self.out = check_output(out, "--out", ARTIFACT_DIRECTORY, error=ArtifactError)
        self.tmp = self.out.with_name(f".{self.out.name}.tmp-{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.files: dict[str, dict] = {}
        try:
            self.tmp.mkdir(parents=True)
        except OSError as e:
            raise self.error(e, self.tmp) from None

    def error(self, e: OSError, path: Path) -> ArtifactError:
        """The one line for a failed write (the temporary directory is removed)."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return ArtifactError(
                f"{path}: no space left on the file system mounted at "
                f"{mount_point(self.out.parent)} while writing the artifact; nothing was kept"
            )
        return ArtifactError(f"{path}: could not write the artifact ({e.strerror or e})")

    def tensor(self, folder: str, key: str, t: torch.Tensor) -> str:
        """Store `t` as `folder/<key>.npy`; returns its relative path."""
        array, dtype = _to_numpy(t)
        rel = f"{folder}/{_file_name(key)}"
        path = self.tmp / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                np.save(f, array, allow_pickle=False)
        except OSError as e:
            raise self.error(e, self.out / rel) from None
        self.files[rel] = {"dtype": dtype, "shape": list(array.shape)}
        return rel

    def write_bytes(self, rel: str, data: bytes) -> str:
        path = self.tmp / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except OSError as e:
            raise self.error(e, self.out / rel) from None
        self.files[rel] = {}
        return rel

    def path(self, rel: str) -> Path:
        """Where a file the caller writes itself goes (then `adopt(rel)`)."""
        p = self.tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def adopt(self, rel: str) -> None:
        self.files[rel] = {}

    def finish(self, manifest: dict) -> Path:
        rels = sorted(self.files)
        digests = file_digests([self.tmp / r for r in rels], "sha256")
        for rel, digest in zip(rels, digests):
            self.files[rel].update(sha256=digest, bytes=(self.tmp / rel).stat().st_size)
        body = {**manifest, "files": self.files}
        body.setdefault("made_by", {})["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        manifest = {"format": FORMAT, "format_version": VERSION, **seal(body)}
        try:
            (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            for p in [*(self.tmp / r for r in rels), self.tmp / MANIFEST]:
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            publish(self.tmp, self.out)  # an empty directory at `out` is replaced
        except OSError as e:
            raise self.error(e, self.out) from None
        return self.out

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


# --- reading --------------------------------------------------------------------------------------


@dataclass
class Artifact:
    """A verified artifact: its manifest and tensors."""

    path: Path
    manifest: dict
    tables: list[TableSpec]
    precisions: list[str]
    rows: list[torch.Tensor]
    dense: dict[str, torch.Tensor]

    @property
    def mapping_dir(self) -> Path | None:
        m = self.manifest.get("categorical") or {}
        return self.path / m["dir"] if "dir" in m else None  # frequency or contiguous hash


def read_manifest(path: Path) -> dict:
    """The manifest's header and body, the body's checksum and structure checked."""
    path = Path(path)
    where = path / MANIFEST
    if not path.is_dir():
        raise ArtifactError(f"{path}: no such artifact directory")
    if not where.is_file():
        raise ArtifactError(f"{where}: not found (not an inference artifact, or an unfinished one)")
    try:
        manifest = json.loads(where.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{where}: corrupt: not valid JSON ({e})") from None
    if isinstance(manifest, dict) and manifest.get("format") == FORMAT:
        if manifest.get("format_version") == 1:
            raise ArtifactError(
                f"{where}: artifact format version 1, whose manifest carries no checksum; "
                "re-export it with python -m hybrid_dlrm.serving.quantize"
            )
    check_header(manifest, where, format=FORMAT, versions=(VERSION,), kind="artifact format",
                 what="hybrid-dlrm inference artifact", error=ArtifactError, version_key="format_version")  # fmt: skip
    try:
        body = unseal(manifest)
    except Damaged as e:
        raise ArtifactError(f"{where}: corrupt: {e} (edited or damaged)") from None
    except (KeyError, TypeError):
        raise ArtifactError(
            f"{where}: corrupt: not a sealed manifest (no body and crc32)"
        ) from None
    if not isinstance(body, dict):
        raise ArtifactError(f"{where}: corrupt: its body is not a JSON object")
    problem = structure_problem(body)
    if problem:
        raise ArtifactError(f"{where}: corrupt: {problem}")
    return {"format": FORMAT, "format_version": VERSION, **body}


_TABLE_KEYS = {"name": str, "feature": str, "precision": str, "file": str, "rows": int, "dim": int}


def structure_problem(m: dict) -> str | None:
    """What is structurally wrong with a manifest body (missing entries, wrong types, tables that
    do not match the architecture or name files not listed), or None."""
    for key, kind in (("model", dict), ("tables", list), ("dense", dict), ("files", dict)):
        if not isinstance(m.get(key), kind):
            found = type(m[key]).__name__ if key in m else "nothing"
            return f"{key!r}: expected a JSON {'object' if kind is dict else 'list'}, found {found}"
    files = m["files"]
    for rel, rec in files.items():
        if not isinstance(rec, dict):
            return f"files[{rel!r}]: expected a JSON object"
    for i, rec in enumerate(m["tables"]):
        if not isinstance(rec, dict):
            return f"tables[{i}]: expected a JSON object"
        for key, kind in _TABLE_KEYS.items():
            value = rec.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                return f"tables[{i}][{key!r}]: expected {kind.__name__}, found {value!r}"
        if rec["file"] not in files:
            return f"tables[{i}]: its file {rec['file']!r} is not listed in 'files'"
    num_sparse = m["model"].get("num_sparse")
    if num_sparse is not None and num_sparse != len(m["tables"]):
        return f"'tables': {len(m['tables'])} entries, the model has {num_sparse} tables"
    dense = m["dense"].get("files")
    if not isinstance(dense, dict):
        return f"'dense': its 'files' should be a JSON object, found {type(dense).__name__}"
    for key, rel in dense.items():
        if rel not in files:
            return f"dense file {key!r}: {rel!r} is not listed in 'files'"
    return None


def verify_files(path: Path, manifest: dict) -> None:
    """Every listed file present, of its size and SHA-256; ArtifactError naming the first bad."""
    files = manifest["files"]
    for rel, rec in files.items():
        p = path / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ArtifactError(
                f"{path / MANIFEST}: corrupt: file name {rel!r} leaves the artifact"
            )
        if not p.is_file():
            raise ArtifactError(f"{p}: missing (listed in {MANIFEST})")
        size = p.stat().st_size
        if size != rec.get("bytes"):
            raise ArtifactError(
                f"{p}: {size} bytes, the manifest says {rec.get('bytes')} (truncated or replaced)"
            )
    rels = list(files)
    digests = file_digests([path / r for r in rels], "sha256")
    for rel, digest in zip(rels, digests):
        if digest != files[rel].get("sha256"):
            raise ArtifactError(f"{path / rel}: corrupt: its SHA-256 does not match the manifest")


def _load_tensor(path: Path, rel: str, rec: dict, mmap: bool = False) -> torch.Tensor:
    p = path / rel
    try:  # mmap: pages read when touched (copy-on-write: writable, the file never changed)
        a = np.load(p, allow_pickle=False, mmap_mode="c" if mmap else None)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{p}: not a readable .npy file ({e})") from None
    expected = "uint16" if rec["dtype"] == "bfloat16" else rec["dtype"]
    if str(a.dtype) != expected or list(a.shape) != rec["shape"]:
        raise ArtifactError(
            f"{p}: {a.dtype} {list(a.shape)}, the manifest says {expected} {rec['shape']}"
        )
    return _from_numpy(a, rec["dtype"])


def load(path: str | Path, map_tables: bool = False) -> Artifact:
    """Read and verify an artifact (see the module docstring). `map_tables`: the tables'
    tensors are memory-mapped, not read (tables larger than memory, served from the SSD tier)."""
    path = Path(path)
    manifest = read_manifest(path)
    verify_files(path, manifest)
    files = manifest["files"]
    tables, precisions, rows = [], [], []
    try:
        for rec in manifest["tables"]:
            spec = TableSpec(rec["name"], int(rec["rows"]), int(rec["dim"]), rec["feature"])
            check_precision(rec["precision"], spec.embedding_dim, spec.name)
            t = _load_tensor(path, rec["file"], files[rec["file"]], map_tables)
            expected = (spec.num_embeddings, row_bytes(spec.embedding_dim, rec["precision"]))
            if tuple(t.shape) != expected or t.dtype != torch.uint8:
                raise ArtifactError(
                    f"{path / rec['file']}: {t.dtype} {tuple(t.shape)} does not fit table "
                    f"{spec.name} ({spec.num_embeddings} rows of dim {spec.embedding_dim} at "
                    f"{rec['precision']}: uint8 {expected})"
                )
            tables.append(spec)
            precisions.append(rec["precision"])
            rows.append(t)
        dense = {
            key: _load_tensor(path, rel, files[rel])
            for key, rel in manifest["dense"]["files"].items()
        }
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ArtifactError):
            raise
        raise ArtifactError(f"{path / MANIFEST}: corrupt: {type(e).__name__}: {e}") from None
    return Artifact(path, manifest, tables, precisions, rows, dense)
