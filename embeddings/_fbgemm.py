"""Loading fbgemm-gpu, with one clear line when it does not match torch.

fbgemm ships compiled operators built against one torch release; against any other it fails with
undefined symbols deep inside `import fbgemm_gpu`. We turn that into a message naming both
versions. When fbgemm is simply not installed (e.g. a CUDA machine with only PyTorch), callers fall
back to the pure-PyTorch path.
"""

from __future__ import annotations

import importlib.metadata as md
import logging

import torch

from embeddings.errors import FbgemmMismatchError

log = logging.getLogger(__name__)

NEEDED = "torch 2.13.0 with fbgemm-gpu-cpu 1.8.0 (fbgemm-gpu 1.8.0 on CUDA machines)"


def _installed_fbgemm() -> str | None:
    for dist in ("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm-gpu-nightly-cpu", "fbgemm-gpu-nightly"):
        try:
            return f"{dist} {md.version(dist)}"
        except md.PackageNotFoundError:
            continue
    return None


def load_fbgemm() -> bool:
    """True when fbgemm's table-batched embedding ops are usable; False when fbgemm is absent.

    Raises FbgemmMismatchError (one line, both versions) when fbgemm is installed but does not
    load with this torch.
    """
    found = _installed_fbgemm()
    if found is None:
        return False
    try:
        import fbgemm_gpu  # noqa: F401
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except (ImportError, OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FbgemmMismatchError(
            f"fbgemm does not load: found {found} with torch {torch.__version__}; "
            f"needed {NEEDED} ({first})"
        ) from None
    return True


_AVAILABLE: bool | None = None


def fbgemm_available() -> bool:
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = load_fbgemm()
        if not _AVAILABLE:
            log.info("fbgemm-gpu is not installed: embeddings use the pure-PyTorch path")
    return _AVAILABLE


def fbgemm_has_kernels_for(device: torch.device) -> bool:
    """True when fbgemm's table-batched embedding ops run on `device` here."""
    if not fbgemm_available():
        return False
    if device.type == "cpu":
        return True
    # The CPU build of fbgemm registers no CUDA kernels for table-batched embeddings.
    try:
        md.version("fbgemm-gpu")
        return device.type == "cuda"
    except md.PackageNotFoundError:
        return False
