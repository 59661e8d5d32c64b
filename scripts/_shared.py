"""What several scripts use, in one module (scripts import this, never each other's helpers).

A script puts the checkout and this directory on `sys.path` before importing it:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _shared import cpu_flags, load_average, make_profile

(`_shared`, not `common`: this directory comes first on `sys.path` when a script runs, and a
`scripts/common.py` would hide a package named `common`.)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dlrm import TrainConfig
from dlrm.data import build_data
from embeddings.profile import AccessProfiler
from perfmodel.hardware import cpu_flags

__all__ = ["cpu_flags", "load_average", "make_profile"]

KAGGLE_TRAIN_INPUTS = 45_840_617  # Criteo Kaggle's training set: what a profile's sample rate is of


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, recorded beside timings (a busy neighbour shows)."""
    return [round(x, 2) for x in os.getloadavg()]


def make_profile(base: TrainConfig, samples: int, path: Path) -> dict:
    """Count `samples` training inputs from epochs 1, 2, ... (the runs train on epoch 0 only)."""
    t0 = time.perf_counter()
    data = build_data(base)
    train = data.train
    profiler = AccessProfiler(data.table_sizes, data.feature_names)
    epoch, seen = 1, 0
    while seen < samples:
        for batch in train.batches(epoch):
            profiler.add_kjt(batch.sparse_features)
            seen += batch.labels.numel()
            if seen >= samples:
                break
        epoch += 1
    profile = profiler.finish(sample_rate=samples / KAGGLE_TRAIN_INPUTS)
    profile.save(path)
    return {
        "inputs": profile.inputs,
        "seconds": round(time.perf_counter() - t0, 1),
        "file": str(path),
    }
