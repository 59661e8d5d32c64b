"""The embedding part of a step alone: fbgemm's own module against embeddings/cpu_tbe.py, and the
memory's floor for the same rows. Prints one JSON object.

    python scripts/bench_embedding.py                      # full Kaggle tables, b128 and b2048
    python scripts/bench_embedding.py --table-scale 0.01 --steps 12

Per batch size: two collections of the same tables (SGD), fbgemm's module (`fbgemm_module`) and
ours (`parallel`), each a forward and a backward of the same batches, alternated step by step
(which goes first alternates too), with the caches flushed (64 MB written) before the forward and
again before the backward, as a step's dense part would; medians over the steps after the first
4. `floor`: the same batches' rows read once (`read_once_us`), and read and written in place
(`read_modify_write_us`), tables in parallel, from flushed caches: what any lookup and update of
those rows costs at least on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _shared import cpu_flags, load_average  # noqa: E402

from data_pipeline.synthetic import (  # noqa: E402
    KAGGLE_TABLE_SIZES,
    PlantedWorld,
    SyntheticBatchSource,
    SyntheticConfig,
)
from embeddings.config import TableSpec  # noqa: E402
from embeddings.fused import FusedEmbeddingBagCollection  # noqa: E402
from embeddings.kjt_ops import in_feature_order  # noqa: E402
from embeddings.optimizer import SparseOptimizer  # noqa: E402
from hybrid_dlrm.common import quick  # noqa: E402

PROG = "bench_embedding.py"
DIM = 16
FLUSH_BYTES = 64 << 20  # twice this machine's 32 MB L3


@numba.njit(parallel=True)
def _read_once(w, woff, idx, off, batch, dim):
    out = np.zeros(woff.size, np.float32)
    for t in numba.prange(woff.size):
        s = np.float32(0)
        for p in range(off[t * batch], off[(t + 1) * batch]):
            s += w[woff[t] + idx[p] * dim]
        out[t] = s
    return out.sum()


@numba.njit(parallel=True)
def _read_modify_write(w, woff, idx, off, batch, dim):
    for t in numba.prange(woff.size):
        for p in range(off[t * batch], off[(t + 1) * batch]):
            e = woff[t] + idx[p] * dim
            for d in range(dim):
                w[e + d] += np.float32(0)


def measure(sizes: list[int], batch: int, steps: int) -> dict:
    world = PlantedWorld(SyntheticConfig(table_sizes=sizes))
    tables = [TableSpec(f"t_{i}", n, DIM, f"cat_{i}") for i, n in enumerate(sizes)]
    names = [t.feature_name for t in tables]
    batches = []
    for b in SyntheticBatchSource(world, "train", batch, steps).batches():
        kjt = in_feature_order(b.sparse_features, names)
        batches.append((kjt.values().long(), kjt.offsets().long()))
    opt = SparseOptimizer("sgd", 0.1)
    ours = FusedEmbeddingBagCollection(tables, opt, backend="fbgemm")
    theirs = FusedEmbeddingBagCollection(tables, opt, backend="fbgemm")
    lookups = {"fbgemm_module": theirs._impl, "parallel": ours._lookup}
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8)
    times: dict[str, dict[str, list[float]]] = {k: {"fwd": [], "bwd": []} for k in lookups}
    floor: dict[str, list[float]] = {"read_once": [], "read_modify_write": []}
    w = ours._impl.weights_host.detach().numpy()
    woff = ours._impl.weights_offsets.numpy()
    for i, (ids, offsets) in enumerate(batches):
        order = list(lookups) if i % 2 else list(lookups)[::-1]
        for name in order:
            flush.add_(1)
            t0 = time.perf_counter()
            out = lookups[name](ids, offsets)
            t1 = time.perf_counter()
            grad = torch.ones_like(out)
            flush.add_(1)
            t2 = time.perf_counter()
            out.backward(grad)
            t3 = time.perf_counter()
            if i >= 4:
                times[name]["fwd"].append(t1 - t0)
                times[name]["bwd"].append(t3 - t2)
        for name, kernel in (("read_once", _read_once), ("read_modify_write", _read_modify_write)):
            flush.add_(1)
            t0 = time.perf_counter()
            kernel(w, woff, ids.numpy(), offsets.numpy(), batch, DIM)
            if i >= 4:
                floor[name].append(time.perf_counter() - t0)

    def us(xs: list[float]) -> int:
        return round(statistics.median(xs) * 1e6)

    return {
        "lookups": int(batches[0][1][-1]),
        **{k: {f"{p}_us": us(v) for p, v in parts.items()} for k, parts in times.items()},
        "floor": {f"{k}_us": us(v) for k, v in floor.items()},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--table-scale", type=float, default=1.0)
    p.add_argument("--batch-sizes", default="128,2048")
    p.add_argument("--steps", type=int, default=40)
    a = p.parse_args(argv)
    try:
        batch_sizes = [int(x) for x in a.batch_sizes.split(",") if x]
    except ValueError:
        p.error(f"--batch-sizes: expected comma-separated integers, got {a.batch_sizes!r}")
    if a.table_scale <= 0 or a.steps < 5 or not batch_sizes or min(batch_sizes) < 1:
        p.error("expected --table-scale > 0, --steps >= 5 and batch sizes >= 1")
    # the docs' walk (HYBRID_DLRM_QUICK): the same measurements at walk sizes
    scale = quick.cap_scale("--table-scale", a.table_scale)
    steps = quick.cap("--steps", a.steps, like="--num-batches")  # steps, as a run's epoch
    batch_sizes = sorted({quick.cap("--batch-sizes", b) for b in batch_sizes})
    quick.announce(PROG)
    sizes = [max(1, int(n * scale)) for n in KAGGLE_TABLE_SIZES]
    before = load_average()
    result = {
        "bench": "embedding",
        "table_rows": sum(sizes),
        "steps": steps,
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "cpu_flags": cpu_flags(),
        "load_average_before": before,
        "batches": {str(b): measure(sizes, b, steps) for b in batch_sizes},
        "load_average_after": load_average(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
