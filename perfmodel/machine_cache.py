"""Where this machine's measured descriptions are cached: one directory (``~/.cache/hybrid-dlrm/``
or ``HYBRID_DLRM_CACHE``) and the key of the machine (CPU model, thread count, torch version and
CUDA device) that names their files. Below everything that measures: the hardware description
(hardware.py), the disk (disk.py), the fitted model and the captured graphs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from hybrid_dlrm.common.machine import cpu_model


def cache_dir() -> Path:
    return Path(os.environ.get("HYBRID_DLRM_CACHE", Path.home() / ".cache" / "hybrid-dlrm"))


def machine_key() -> str:
    parts = [cpu_model(), str(torch.get_num_threads()), torch.__version__]
    if torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name(0))
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]
