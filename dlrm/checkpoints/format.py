"""Checkpoints and model files: written atomically, verified when read, read without pickle.

A checkpoint is one `torch.save` file of tensors and plain values (loaded with
`weights_only=True`, so a file from someone else cannot run code). It is first written to a
temporary file in the same directory, flushed to disk, then renamed over its final name: a crash
while writing leaves every earlier checkpoint intact, and the temporaries such a crash leaves are
removed by the next save or resume (`remove_temporaries`).

Every file also carries a manifest of checksums (`checksums`): the CRC-32s of each tensor's bytes
(one per 16 MiB) and one of everything else (the plain values, the layout of the nested dicts,
every tensor's dtype and shape). torch's zip reader checks none of the CRCs its writer stores, so
without the manifest a flipped bit or a zeroed page loads as a silently different model. `load`
checks the manifest before returning anything, and names the tensor that does not match.

The checksum is CRC-32 (hybrid_dlrm/common/crc.py says why, and why ISA-L computes it): 30 GB/s
a core here, so verifying a Kaggle-sized checkpoint (2.2 GB) takes about 0.1 s against torch.load's
1 s. The trainer reads and verifies the checkpoint while it builds the data and the model, so even
that is hidden behind table initialisation (docs/training.md: what it adds to `--resume`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import warnings
import zipfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data_pipeline.errors import mount_point
from dlrm.errors import CheckpointError
from hybrid_dlrm.common.atomic import atomic_write
from hybrid_dlrm.common.crc import crc32
from hybrid_dlrm.common.header import check_header
from hybrid_dlrm.common.outputs import Purpose, torch_format_is

log = logging.getLogger(__name__)

FORMAT = "hybrid-dlrm-checkpoint"
# 2: the checksum manifest. 1: none (still loaded, see `_check_unverified`).
VERSION = 2
CHECKSUMS = "checksums"
# what --save-model writes: an existing checkpoint or model file of ours is replaced
MODEL_FILE = Purpose("model file", identify=torch_format_is(FORMAT))
_NAME = re.compile(r"^step_(\d{9})\.pt$")
_SHARDED = re.compile(
    r"^step_(\d{9})$"
)  # a directory of per-rank shards (dlrm/checkpoints/sharded.py)
_TEMPORARY = re.compile(r"^\.(.+)\.tmp-(\d+)$")
_ALGORITHM = "crc32/16MiB"
_CHUNK = 16 * 2**20
_THREADS = min(8, os.cpu_count() or 1)


# --- checksums --------------------------------------------------------------------------------


def _tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's values as bytes, on the host."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def _crc(data) -> str:
    return f"{crc32(data):08x}"


def _tensor_checksums(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Per tensor, the CRC-32 of each 16 MiB of its bytes, the chunks of one tensor computed on
    several threads (one tensor at a time on the host: a GPU model's checkpoint is checked
    without a second copy of it all in host memory)."""
    sums = {}
    with ThreadPoolExecutor(_THREADS) as pool:
        for name, t in tensors.items():
            data = _tensor_bytes(t)
            chunks = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)]
            sums[name] = " ".join(pool.map(_crc, chunks))
    return sums


def _walk(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """A JSON-able outline of `obj` with every tensor replaced by its dtype and shape; the tensors
    are collected in `tensors` under their path (`model/bot.0.weight`). Types are spelled out
    (a tuple is not a list, the key 0 is not the key "0") so that any change shows."""
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj
        return ["tensor", str(obj.dtype), list(obj.shape)]
    if isinstance(obj, Mapping):
        return ["dict", [[repr(k), _walk(v, f"{path}/{k}", tensors)] for k, v in obj.items()]]
    if isinstance(obj, (list, tuple)):
        kind = type(obj).__name__
        return [kind, [_walk(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]]
    return [type(obj).__name__, repr(obj)]


def checksums(obj: dict) -> dict:
    """The manifest stored with `obj`: a digest of its outline and one per tensor."""
    tensors: dict[str, torch.Tensor] = {}
    outline = {k: _walk(v, k, tensors) for k, v in obj.items() if k != CHECKSUMS}
    return {
        "algorithm": _ALGORITHM,
        "outline": _crc(json.dumps(outline).encode()),
        "tensors": _tensor_checksums(tensors),
    }


def _verify(data: dict, path: Path) -> None:
    stored = data.pop(CHECKSUMS)
    tensors: dict[str, torch.Tensor] = {}
    outline = {k: _walk(v, k, tensors) for k, v in data.items()}
    if not (
        isinstance(stored, dict)
        and stored.get("algorithm") == _ALGORITHM
        and isinstance(stored.get("tensors"), dict)
    ):
        raise CheckpointError(f"{path}: corrupt: its checksum manifest is damaged")
    if stored.get("outline") != _crc(json.dumps(outline).encode()):
        raise CheckpointError(
            f"{path}: corrupt: its structure or plain values (step, configuration, RNG state, "
            "tensor shapes) do not match their checksum"
        )
    computed = _tensor_checksums(tensors)
    bad = [name for name in tensors if stored["tensors"].get(name) != computed[name]]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise CheckpointError(
            f"{path}: corrupt: tensor {', '.join(bad[:3])}{more} does not match its checksum"
        )


# --- writing ----------------------------------------------------------------------------------


def atomic_save(obj: Any, path: Path, what: str = "checkpoint") -> None:
    """Write `obj` to `path` through a temporary file, or raise one CheckpointError line (disk
    full, no permission) with `path` untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_temporaries(path.parent, path.name)
    try:
        with atomic_write(path) as f:  # `.NAME.tmp-PID`, the name `remove_temporaries` knows
            torch.save(obj, f)
    except (OSError, RuntimeError) as e:
        raise _write_error(e, path, what) from None


def _write_error(e: Exception, path: Path, what: str) -> Exception:
    # torch's zip writer reports a short write (the disk filled up under it) as
    # "unexpected pos N vs M", a RuntimeError; the file system's own errors are OSErrors.
    full = (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        isinstance(e, RuntimeError) and "unexpected pos" in str(e)
    )
    if full:
        free = shutil.disk_usage(path.parent).free
        return CheckpointError(
            f"{path}: no space left on the file system mounted at {mount_point(path.parent)} "
            f"while writing the {what} ({free // 1024} KiB free); nothing earlier was changed"
        )
    if isinstance(e, OSError):
        reason = e.strerror or str(e) or type(e).__name__
        return CheckpointError(
            f"{path}: could not write the {what} ({reason}); nothing earlier was changed"
        )
    return e  # a RuntimeError that is not about the file: a bug, keep its traceback


def save(obj: dict, path: Path, what: str = "checkpoint") -> None:
    """`obj` with its checksum manifest, written atomically."""
    atomic_save({**obj, CHECKSUMS: checksums(obj)}, path, what)


def remove_temporaries(directory: Path, name: str | None = None) -> None:
    """Delete the temporaries of interrupted writes (each as large as a whole checkpoint) in
    `directory`, of `name` only or of every checkpoint. A temporary is named after the process
    writing it: one whose process still runs (a second run in the same directory) is left."""
    if not directory.is_dir():
        return
    for p in directory.iterdir():
        m = _TEMPORARY.match(p.name)
        if m and (m.group(1) == name if name else _NAME.match(m.group(1))):
            if not _running(int(m.group(2))):
                log.info("removing %s, left by an interrupted write", p)
                p.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is not writing it: it is about to write the same file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


# --- reading ----------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _read_error(e: Exception) -> str:
    """Why torch could not read a file, in whole sentences, without its advice to load with
    `weights_only=False` (that would run any code the file holds) or to allowlist classes."""
    text = _one_line(str(e))
    unpickler = "WeightsUnpickler error:" in text or text.startswith("Weights only load failed")
    if "WeightsUnpickler error:" in text:  # torch's advice comes first, the reason after this
        text = text.split("WeightsUnpickler error:", 1)[1]
    text = text.removeprefix("Weights only load failed.").split("Check the documentation")[0]
    sentences = [
        s.strip()
        for s in re.split(r"(?<=\.) ", text)
        if s.strip() and not re.search(r"weights_only|allow_pickle|Please|trust", s)
    ]
    # the first sentence says what failed; torch's next ones are general advice
    reason = sentences[0].rstrip(".") if sentences else ""
    if not re.search(r"[A-Za-z]{3}", reason):  # KeyError(18) from a damaged pickle says "18"
        reason = f"{type(e).__name__}: {reason}" if reason else type(e).__name__
    if unpickler:
        return (
            "its data record is damaged or holds Python objects other than tensors and plain "
            f"values, which are never unpickled: {reason}"
        )
    return reason


def is_sharded(path: Path) -> bool:
    """A sharded checkpoint's directory (dlrm/checkpoints/sharded.py), complete (its index
    written)."""
    return bool(_SHARDED.match(path.name)) and (path / "index.json").is_file()


def load(path: Path) -> dict:
    """A checkpoint file or model file (a sharded checkpoint: dlrm/checkpoints/store.py's `read`), verified against its checksums; CheckpointError naming the
    file (and the tensor, where one is to blame) otherwise."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        with warnings.catch_warnings():  # torch's notes on odd files: the error says enough
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated/corrupt/unsafe files
        reason = _zip_damage(path) or _read_error(e)
        raise CheckpointError(f"{path}: not a readable checkpoint ({reason})") from None
    verified = isinstance(data, dict) and CHECKSUMS in data
    if verified:
        _verify(data, path)  # first: a damaged byte anywhere is named as such
    version = check_header(data, path, format=FORMAT, versions=(VERSION, 1), what="hybrid-dlrm checkpoint",
                           kind="checkpoint format", error=CheckpointError)  # fmt: skip
    if version == 1:
        _check_unverified(path)
    elif not verified:  # lost, as only damage can lose it
        raise CheckpointError(f"{path}: corrupt: its checksum manifest is missing")
    return data


def _zip_damage(path: Path) -> str | None:
    """What is wrong with the file as the zip archive torch writes, in words torch's own errors
    lack ("[Errno 22] Invalid argument" for a file cut short), or None."""
    size = path.stat().st_size
    if size == 0:
        return "empty: 0 bytes"
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        return f"cut short, or not a checkpoint: no zip directory at its end ({size} bytes)"
    except Exception as e:  # a damaged directory fails in many ways (names that do not decode)
        return f"its zip directory is damaged ({type(e).__name__})"
    with z:
        try:
            bad = z.testzip()
        except Exception as e:
            return f"damaged: {_one_line(str(e)) or type(e).__name__}"
    return f"record {bad!r} does not match its CRC-32" if bad else None


def _check_unverified(path: Path) -> None:
    """Files written before checksums (version 1) are still loaded, with one warning: refusing
    them would strand every run and model trained before, with no way to convert them but
    loading them. They are not taken on trust: torch's zip writer stored a CRC-32 of every record
    (which its reader never checks), so damage inside a record is still caught here."""
    problem = _zip_damage(path)
    if problem:
        raise CheckpointError(f"{path}: corrupt: {problem}")
    log.warning(
        "%s: written before checkpoints carried checksums; only the zip records' CRC-32s were "
        "checked (the next checkpoint will carry checksums)",
        path,
    )


# --- run directories --------------------------------------------------------------------------


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:09d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints in a directory, oldest first (not yet verified): files, and sharded
    checkpoints' directories once their index is written."""
    if not directory.is_dir():
        return []
    return sorted(
        (p for p in directory.iterdir()
         if _NAME.match(p.name) or is_sharded(p)),
        key=lambda p: p.name.removesuffix(".pt"),
    )  # fmt: skip


def prune(directory: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints; drop the temporaries of interrupted writes."""
    for old in list_checkpoints(directory)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    remove_temporaries(directory)


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(
        ("MT19937", state["numpy_keys"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0)
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- model files (weights only: --save-model / --load-model, inference) ----------------------------


def is_model_file(data: dict) -> bool:
    """A `--save-model` file: weights without optimizer state or position in the run."""
    return "train_state" not in data


def save_model_file(
    path: Path, model: torch.nn.Module, arch: dict, state: dict | None = None
) -> None:
    """Weights only (no optimizer state), with the architecture they were trained for (`state`:
    the model's state dict when taken already)."""
    state = model.state_dict() if state is None else state
    obj = {"format": FORMAT, "version": VERSION, "arch": arch, "model": state}
    save(obj, path, what="model file")


def load_model_state(model: torch.nn.Module, state: dict, path: Path) -> None:
    """Every weight of `model` from `state` (written by any placement); one line when it does not fit."""
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise CheckpointError(
            f"{path}: does not fit the model ({str(e).splitlines()[-1].strip()})"
        ) from None
    problems = list(result.missing_keys) + list(result.unexpected_keys)
    if problems:
        raise CheckpointError(f"{path}: does not fit the model (keys {', '.join(problems[:4])})")


def load_model_file(path: Path, model: torch.nn.Module) -> dict:
    """Load a model file or checkpoint's weights into `model`; returns the file's contents."""
    if not path.exists():
        raise CheckpointError(f"--load-model: no such file: {path}")
    data = load(path)
    load_model_state(model, data["model"], path)
    return data
