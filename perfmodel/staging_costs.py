"""This machine's costs of a staging's pieces, measured once and cached beside the hardware
description (perfmodel/hardware.py): per-row gathers and scatters of 16- and 128-float rows, the
row cache's hash lookup, a 4 KiB block's CRC (`measure_staging`), and the step thread's own part
of a staged step timed on a real Hotline collection (`measure_step_load`). The placement
planner's predictions of Hotline and tiered candidates (perfmodel/placement_costs.py) read them
through `staging_figures`, `load_us` and `row_us`."""

from __future__ import annotations

import json
import time
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from embeddings.config import SparseOptimizer


def _time(fn, min_s: float = 0.05) -> float:
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_s:
            return t / n
        n *= 2


def measure_staging() -> dict:
    """Per-row and per-id costs of what a staging does, on one thread (the worker's): gathering
    rows of 16 and 128 floats from a table larger than the caches (index_select), writing them
    back (index_copy_), the row cache's hash lookup
    and the CRC check of a 4 KiB block."""
    from embeddings.ssd.cache import SlotMap
    from hybrid_dlrm.common.crc import crc32

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out: dict[str, Any] = {}
        n = 8192
        for rf in (16, 128):
            table = torch.randn((64 << 20) // (4 * rf), rf)
            ids = torch.randint(0, table.shape[0], (n,))
            rows = table[ids]
            out[f"gather_ns_{rf}"] = _time(lambda t=table, i=ids: t.index_select(0, i)) / n * 1e9
            out[f"scatter_ns_{rf}"] = (
                _time(lambda t=table, i=ids, r=rows: t.index_copy_(0, i, r)) / n * 1e9
            )
        sm = SlotMap(1 << 18)
        keys = torch.randperm(1 << 22)[: 1 << 17]
        sm.add(keys, torch.arange(keys.numel()))
        q = torch.randint(0, 1 << 22, (n,))
        out["hash_ns_per_row"] = _time(lambda: sm.get(q)) / n * 1e9
        block = np.random.default_rng(0).integers(0, 255, 4096, dtype=np.uint8)
        out["crc_us_per_block"] = _time(lambda: crc32(block)) * 1e6
        return out
    finally:
        torch.set_num_threads(threads)


LOAD_TABLES, LOAD_ROWS = 8, 200_000  # the measured collection: larger than the caches
LOAD_BATCHES = (128, 1024)  # mini-batches of one lookup per table: ~1k and ~7k cold rows
STEP_BYTES = 32 << 20  # more than the last-level cache: a step's kernels leave it cold


def _zipf_batch(rng, batch: int, a: float = 1.05):
    """One lookup per table and input, Zipf-skewed like the synthetic data (consecutive
    batches share their popular rows, as training's do, so the step renews some)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ranks = np.arange(1, LOAD_ROWS + 1, dtype=np.float64) ** -a
    values = rng.choice(LOAD_ROWS, size=LOAD_TABLES * batch, p=ranks / ranks.sum())
    return KeyedJaggedTensor.from_lengths_sync(
        [f"cat_{t}" for t in range(LOAD_TABLES)], torch.from_numpy(values),
        torch.ones(LOAD_TABLES * batch, dtype=torch.int32),
    )  # fmt: skip


def measure_step_load(row_floats: int, steps: int = 30) -> tuple[float, float]:
    """The step thread's own part of a staged step, timed on a real Hotline collection (host
    tier, no hot rows), one thread, in the train pipeline's order: the previous staged rows
    written home, then this batch's renewed (rows the write-back changed since its staging was
    read: copied from the slots, or read again), the slots sized and filled (`_load`). Fitted as
    fixed + per-row over two batch sizes: (fixed us, ns per cold row)."""
    from embeddings.config import TableSpec
    from embeddings.staged.hotline import hotline_collection

    tables = [TableSpec(f"t{t}", LOAD_ROWS, row_floats, f"cat_{t}") for t in range(LOAD_TABLES)]
    coll = hotline_collection(tables, SparseOptimizer("sgd", 0.1), device="cpu")
    rng = np.random.default_rng(0)
    step = torch.zeros(STEP_BYTES // 4)  # what a training step streams between two loads
    xs, ys = [], []
    for batch in LOAD_BATCHES:
        kjts = [_zipf_batch(rng, batch) for _ in range(steps + 2)]
        nxt = coll.stage(kjts[0], version=coll.version)
        for i in range(steps + 1):
            cur, nxt = nxt, coll.stage(kjts[i + 1], version=coll.version)  # staged before the
            step.add_(1.0)  # write-back the load does, as with prefetch; caches cold, as in a step
            t0 = time.thread_time()
            coll._load(cur, training=True)
            if i:  # the first has nothing to write back
                xs.append(cur.rows)
                ys.append(time.thread_time() - t0)
    coll._write_back()
    # the line through each batch size's medians: a neighbour's time slice moves a mean
    half = len(xs) // 2
    (x0, y0), (x1, y1) = (
        (np.median(xs[a:b]), np.median(ys[a:b])) for a, b in ((0, half), (half, None))
    )
    slope = max((y1 - y0) / (x1 - x0), 0.0)
    return max(float(y0 - slope * x0), 0.0) * 1e6, float(slope) * 1e9


def load_us(figs: dict, rows: float, row_floats: int) -> float:
    """The step thread's part for `rows` cold rows: `measure_step_load`'s line, its per-row
    cost and its fixed cost linear in the row's floats between 16 and 128 (as `_row_us`)."""
    return row_us(figs, "load_fixed", row_floats) + rows * row_us(figs, "load", row_floats)


QUICK_LOAD_STEPS = 8  # a calibration's (perfmodel/calibration.py): a third of the time


@lru_cache(maxsize=2)
def staging_figures(quick: bool = False) -> dict:
    """`measure_staging`'s figures, cached per machine beside the hardware description; measured
    when absent (`quick`: the step's part over `QUICK_LOAD_STEPS` steps per batch size)."""
    from hybrid_dlrm.common.atomic import write_json
    from perfmodel.hardware import cache_dir, machine_key

    path = cache_dir() / f"staging-{machine_key()}.json"
    try:
        figs = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        figs = measure_staging()
    if "load_ns_16" in figs:
        return figs
    for rf in (16, 128):  # also where a figures file is from before the step's part was measured
        fixed_us, figs[f"load_ns_{rf}"] = measure_step_load(rf, QUICK_LOAD_STEPS if quick else 30)
        figs[f"load_fixed_ns_{rf}"] = fixed_us * 1e3
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, figs)
    return figs


def row_us(figs: dict, kind: str, row_floats: int) -> float:
    """Per-row time of a gather or scatter of `row_floats`-float rows, linear between 16 and 128."""
    a, b = figs[f"{kind}_ns_16"], figs[f"{kind}_ns_128"]
    return (a + (b - a) * (row_floats - 16) / 112) / 1e3
