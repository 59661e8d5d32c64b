"""Checkpoints: written atomically, read without pickle.

A checkpoint is one `torch.save` file of tensors and plain values (loaded with
`weights_only=True`, so a file from someone else cannot run code). It is first written to a
temporary file in the same directory, flushed to disk, then renamed over its final name: a crash
while writing leaves every earlier checkpoint intact.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlrm.errors import CheckpointError

log = logging.getLogger(__name__)

FORMAT = "hybrid-dlrm-checkpoint"
VERSION = 1
_NAME = re.compile(r"^step_(\d{9})\.pt$")


def atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated/corrupt/unsafe files
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({first[:200]})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a hybrid-dlrm checkpoint")
    if data.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {data.get('version')}, expected {VERSION}"
        )
    return data


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step_{step:09d}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints in a directory, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def prune(directory: Path, keep: int) -> None:
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink()


def resolve_resume(resume: str, run_dir: Path) -> Path:
    """`--resume` accepts a checkpoint file, a run directory, or `auto` (this run's directory)."""
    target = run_dir if resume == "auto" else Path(resume)
    if target.is_file():
        return target
    for directory in (target / "checkpoints", target):
        found = list_checkpoints(directory)
        if found:
            return found[-1]
    raise CheckpointError(f"--resume: no checkpoint found at {target}")


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


def save_model_file(path: Path, model: torch.nn.Module, arch: dict) -> None:
    """Weights only (no optimizer state), with the architecture they were trained for."""
    atomic_save(
        {"format": FORMAT, "version": VERSION, "arch": arch, "model": model.state_dict()}, path
    )


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
