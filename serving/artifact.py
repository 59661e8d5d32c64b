"""The inference artifact: a directory a model is served from, which cannot run code when loaded.

    ARTIFACT/manifest.json          what it is (below), with the SHA-256 of every other file
    ARTIFACT/tables/<table>.npy     uint8 [rows, row bytes]: the table at its precision
                                    (embeddings/quantized.py has the row layout)
    ARTIFACT/dense/<name>.npy       the dense weights (serving/model_tensors.py: int8 layers as
                                    codes + per-channel scales, bf16 stored as uint16 bits)
    ARTIFACT/mapping/cat_N.sorted_values.npy, cat_N.sorted_ids.npy
                                    frequency-mode categorical maps (raw value -> row id), the
                                    layout data_pipeline/categorical.Vocabulary reads
    ARTIFACT/sensitivity.json, sensitivity.png   with --emb-precision auto

The manifest (JSON) holds the format version, the architecture, the feature names, every table's
size and precision, every layer's precision, the calibration metrics, the categorical mapping's
parameters, the SHA-256 of the source checkpoint, and per file its SHA-256, size, dtype and shape.
Only `.npy` (read with `allow_pickle=False`) and JSON: no pickle anywhere.

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

from common.atomic import publish
from common.header import check_header
from common.manifest import digests as file_digests
from common.manifest import sha256_file  # noqa: F401 (tests import it from here)
from data_pipeline.errors import mount_point
from embeddings.config import TableSpec
from embeddings.quantized import check_precision, row_bytes

FORMAT = "hybrid-dlrm-inference-artifact"
VERSION = 1
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


class ArtifactWriter:
    """Collects tensors and files in a temporary directory; `finish(manifest)` hashes them,
    writes the manifest and renames the directory into place."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        if self.out.exists() and (not self.out.is_dir() or any(self.out.iterdir())):
            raise ArtifactError(f"{self.out}: already exists; choose another --out or remove it")
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
        manifest = {"format": FORMAT, "format_version": VERSION, **manifest, "files": self.files}
        manifest.setdefault("made_by", {})["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
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
        return self.path / m["dir"] if m.get("mode") == "frequency" else None


def read_manifest(path: Path) -> dict:
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
    check_header(manifest, where, format=FORMAT, versions=(VERSION,), kind="artifact format",
                 what="hybrid-dlrm inference artifact", error=ArtifactError, version_key="format_version")  # fmt: skip
    for key in ("model", "tables", "dense", "files"):
        if key not in manifest:
            raise ArtifactError(f"{where}: corrupt: no {key!r} entry")
    return manifest


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
