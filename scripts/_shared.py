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
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from dlrm import TrainConfig
from dlrm.data import build_data
from embeddings.profile import AccessProfiler
from hybrid_dlrm.common.outputs import OutputRefused, Purpose, check_output
from perfmodel.hardware import cpu_flags

__all__ = ["check_bench_out", "cpu_flags", "load_average", "make_profile"]

KAGGLE_TRAIN_INPUTS = 45_840_617  # Criteo Kaggle's training set: what a profile's sample rate is of


# a benchmark's --out (hybrid_dlrm/common/outputs.py): files are added to any directory; its
# JSON and PNG carry no mark of who wrote them, so an existing one needs --overwrite
BENCH_DIRECTORY = Purpose("benchmark directory", directory=True, identify=lambda d: True)
BENCH_FILE = Purpose("benchmark output")


def check_bench_out(
    out: Path, names: Iterable[str], overwrite: bool, prog: str, flag: str = "--out"
) -> None:
    """`out` and the files `names` a benchmark writes in it, by the output rule, before it
    measures anything; a refusal is one line and exit code 2."""
    try:
        check_output(out, flag, BENCH_DIRECTORY)
        for name in names:
            check_output(Path(out) / name, flag, BENCH_FILE, overwrite=overwrite)
    except OutputRefused as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        raise SystemExit(2) from None


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
