"""The placement planner's predictor: the step time of every candidate placement (dlrm/planning.py).

`predict_candidate(cfg, candidate, sample)` -> `Prediction`, registered with
`dlrm.planning.register_predictor` when perfmodel's plugin module is imported. `sample` is the
planning sample: `.profile` (an `embeddings.profile.AccessProfile`) and `.batches` (the sparse
features, KeyedJaggedTensors, of a few evenly spread training batches the profile did not count:
a counted batch has no cold row the profile missed).

What each kind is predicted from:
- device: the fitted performance model on the device placement's captured step graph
  (`perfmodel.graph`, cached per configuration); huge synthetic tables are captured at a smaller
  `--synthetic-table-scale` and the embedding kernels told the real table sizes (the only thing
  their model reads of them). Without a fitted model: a roofline of the hardware description
  (`source` in `detail` says which).
- host: the host placement's own captured step (what it runs on CPU: the tables in the same
  memory, nothing crosses a link), plus, on CUDA, the pooled embeddings to the device and their
  gradients back at the measured pinned-copy bandwidth.
- fae: the fitted model on FAE's hot and cold step graphs, weighted by the share of all-hot
  inputs (`perfmodel.graph`).
- hotline: the device step over the device tier (the hot rows plus a batch's staging slots), plus
  per batch the unique cold rows (counted by replaying `sample.batches` against the hot set
  `plan_placement` makes at the candidate's budget): the worker maps the lookups and gathers
  the rows with their optimizer state; the step writes the previous batch's rows home, renews
  the staged rows that write-back changed and loads them into the slots: that part is timed once
  on a real Hotline collection (`measure_step_load`: a fixed cost per step, cold caches as after
  a step's kernels, plus a cost per row; the fixed part and the renewal were missing before and
  made Hotline 0.5-1.2 ms slower than predicted). Row costs are this machine's, measured once
  (`staging_figures`). With
  `--hotline-prefetch` >= 1 the worker's part overlaps the step: hidden = min(staging, step) when
  the process has a core beyond torch's threads (2 cores, 1 torch thread: yes); without a spare
  core the worker takes the step's core and nothing is hidden.
- tiered: Hotline's, with the cold rows read from the SSD tier behind the DRAM row cache: the
  cache's real policy (`embeddings.scm_cache.RowCache`, its bookkeeping only) replayed on the
  sample's cold rows at the candidate's cache size gives the hit rate, the misses' 4 KiB blocks
  (reads per step) and the evicted dirty rows' blocks (read, patched, written); their time comes
  from the disk's measured IOPS at the tier's queue depth (`perfmodel.disk`). Steady state is
  assumed: the cache starts holding the cold rows the profile counts most (`warm_rows`: what its
  policy keeps over a long run), and every block was written before (a fresh tier computes never-written rows without I/O,
  `detail.initial_share` says how many misses that would be in the sample).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlrm.config import TrainConfig
from dlrm.planning import Candidate, Prediction, register_predictor
from embeddings.config import SparseOptimizer
from embeddings.hot_map import HotRowMap
from embeddings.lookup_map import map_lookups
from embeddings.placement import parse_bytes, plan_placement
from embeddings.row_layout import table_row_base
from embeddings.scm_cache import RowCache
from embeddings.scm_file import PAYLOAD
from embeddings.tiered import profile_priority

log = logging.getLogger(__name__)

CAPTURE_ROWS = 4_000_000  # larger synthetic tables are captured scaled down (see the module doc)
WRITEBACK_LAG = 2  # a staged batch's rows are written back this many stagings later


# --- the planning sample, replayed -------------------------------------------------------------


@dataclass
class ColdBatch:
    lookups: int  # every lookup of the batch
    cold_lookups: int  # lookups of rows not in the device tier
    cold: torch.Tensor  # the unique cold rows' global ids, sorted (what a staging reads)
    cold_per_table: list[int]  # unique cold rows per table
    map_s: float  # the worker's mapping of the batch (embeddings/lookup_map.py), timed here


def _row_bytes(cfg) -> tuple[int, int, SparseOptimizer]:
    opt = SparseOptimizer(cfg.optimizer, cfg.learning_rate or 0.1)
    dim = int(cfg.arch_sparse_feature_size)
    return dim, dim + opt.state_floats(dim), opt


_PLANS: dict[tuple, Any] = {}


def hot_plan(cfg, sample, hot_budget: int):
    """The one-home plan Hotline and tiered runs make at `hot_budget` (memoised per sample)."""
    dim, _, opt = _row_bytes(cfg)
    key = (id(sample.profile), dim, opt.kind, int(hot_budget))
    if key not in _PLANS:
        if len(_PLANS) > 64:
            _PLANS.clear()
        dims = [dim] * sample.profile.num_tables
        _PLANS[key] = plan_placement(sample.profile, dims, opt, int(hot_budget), one_home=True)
    return _PLANS[key]


_HOT_MAPS: dict[int, tuple[Any, HotRowMap]] = {}


def hot_row_map(plan) -> HotRowMap:
    """The device tier's map of a plan's hot rows, as the staged collection builds it."""
    if id(plan) in _HOT_MAPS and _HOT_MAPS[id(plan)][0] is plan:
        return _HOT_MAPS[id(plan)][1]
    if len(_HOT_MAPS) > 16:
        _HOT_MAPS.clear()
    base = table_row_base(plan.table_sizes)
    tables, rows = plan.hot_ids()
    gids = torch.from_numpy(np.sort(rows + base.numpy()[tables]))
    hot = HotRowMap(gids, base, int(sum(plan.table_sizes)))
    _HOT_MAPS[id(plan)] = (plan, hot)
    return hot


_COLD: dict[tuple, tuple[Any, list[ColdBatch]]] = {}


def cold_batches(sample, plan) -> list[ColdBatch]:
    """Each sample batch mapped as the staging worker maps it (`map_lookups`, the same code): its
    unique cold rows, and the time the mapping took on this machine (best of two: the first call
    of a process compiles)."""
    key = (id(plan), id(sample.batches))
    if key in _COLD and _COLD[key][0] is plan:
        return _COLD[key][1]
    hot = hot_row_map(plan)
    sizes = np.asarray(plan.table_sizes, dtype=np.int64)
    base = table_row_base(plan.table_sizes).numpy()
    n_hot = hot.n_hot.numpy()
    out = []
    for kjt in sample.batches:
        values = kjt.values().numpy()
        lengths = kjt.lengths().numpy()
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            m = map_lookups(values, lengths, kjt.stride(), sizes, base, hot)
            best = min(best, time.perf_counter() - t0)
        table_of = np.repeat(np.arange(sizes.size), lengths.reshape(sizes.size, -1).sum(1))
        cold_lookups = int(np.sum(m.slots >= n_hot[table_of]))
        out.append(ColdBatch(int(values.size), cold_lookups, torch.from_numpy(m.cold_gids),
                             [int(x) for x in m.per_table], best))  # fmt: skip
    if len(_COLD) > 16:
        _COLD.clear()
    _COLD[key] = (plan, out)
    return out


@dataclass
class CacheReplay:
    hits: int
    misses: int
    miss_blocks: list[int]  # per batch: 4 KiB blocks the misses read
    evict_blocks: list[int]  # per batch: blocks the evicted dirty rows patch (read + write)
    initial_misses: int  # misses on blocks no eviction had written before (a fresh tier's)
    evictions: int = 0  # rows the cache evicted (warm-up excluded)

    @property
    def hit_rate(self) -> float | None:
        n = self.hits + self.misses
        return self.hits / n if n else None


_SEEN: dict[int, tuple[Any, np.ndarray, Any]] = {}


def seen_rows(counts: list[np.ndarray], sizes: list[int]) -> tuple[np.ndarray, Any]:
    """The rows a profile saw (global ids, most counted first, ties by id) and the row cache's
    priority function: both read every count once, so they are made once per profile."""
    if id(counts) in _SEEN and _SEEN[id(counts)][0] is counts:
        return _SEEN[id(counts)][1], _SEEN[id(counts)][2]
    base = table_row_base(sizes).numpy()
    gids = np.concatenate([np.flatnonzero(c) + b for c, b in zip(counts, base)])
    cnt = np.concatenate([c[c > 0] for c in counts])
    ranked = gids[np.lexsort((gids, -cnt))]
    _SEEN.clear()
    _SEEN[id(counts)] = (counts, ranked, profile_priority(counts, sizes))
    return ranked, _SEEN[id(counts)][2]


def warm_rows(
    counts: list[np.ndarray], sizes: list[int], hot, capacity: int, chunk: int
) -> list[torch.Tensor]:
    """The cache's steady state, as reads: the `capacity` cold rows the profile counts most,
    read least-counted first in chunks. The policy keeps rows by profile count (plus hits), so a
    long run's cache holds these; a few sample batches replayed on an empty cache would count
    every first touch as a miss, whatever the cache's size."""
    ranked, _ = seen_rows(counts, sizes)
    if not capacity or not ranked.size:
        return []
    top, at, step = [], 0, max(capacity, 1 << 16)
    while at < ranked.size and sum(t.size for t in top) < capacity:  # cold ones, in rank order
        part = ranked[at : at + step]
        top.append(part[hot.slots(torch.from_numpy(part)).numpy() < 0])
        at += step
    top = np.concatenate(top)[:capacity][::-1]  # the top `capacity`, coldest first
    return [torch.from_numpy(np.sort(top[a : a + chunk])) for a in range(0, top.size, chunk)]


def replay_row_cache(
    batches: list[torch.Tensor], total_rows: int, capacity: int, rows_per_block: int,
    priority=None, lag: int = WRITEBACK_LAG, warm: list[torch.Tensor] = (),
) -> CacheReplay:  # fmt: skip
    """The SSD tier's row cache (its own code, bookkeeping only) fed what a tiered run feeds it:
    each staging's unique cold rows read (`ScmTier.read_rows`: lookup, misses admitted clean),
    and `lag` stagings later the same rows written back (`ScmTier._store`: cached rows marked
    dirty, the rest admitted dirty). Evicted dirty rows are written to their blocks. `warm`:
    reads made first and not counted (`warm_rows`)."""
    cache = RowCache(total_rows, 0, capacity, priority)
    if capacity:
        for ids in warm:
            cache.next_access()
            slots = cache.lookup(ids)
            cache.admit(ids[slots < 0], dirty=False)
        cache.hits = cache.misses = cache.evictions = 0
    written = np.zeros(0, dtype=np.int64)
    miss_blocks, evict_blocks, initial = [], [], 0
    pending: list[torch.Tensor] = []
    evicted_now: list[np.ndarray] = []

    def admit(gids: torch.Tensor, dirty: bool) -> None:
        slots, ev = cache.admit(gids, dirty)
        if ev.numel():
            evicted_now.append(cache.evicted_gids().numpy() // rows_per_block)
        if dirty and slots.numel() < gids.numel():  # no room: written straight to the file
            evicted_now.append(gids[slots.numel() :].numpy() // rows_per_block)

    def store(ids: torch.Tensor) -> None:
        if not capacity:
            evicted_now.append(ids.numpy() // rows_per_block)
            return
        slots = cache.slots(ids)
        hit = slots >= 0
        cache.dirty[slots[hit]] = True
        miss = torch.nonzero(~hit).squeeze(1)
        if miss.numel():
            admit(ids[miss], dirty=True)

    for ids in batches:
        evicted_now.clear()
        cache.next_access()
        if capacity:
            slots = cache.lookup(ids)
            miss = ids[slots < 0]
        else:
            cache.misses += ids.numel()
            miss = ids
        miss_block = miss.numpy() // rows_per_block
        miss_blocks.append(int(np.unique(miss_block).size))
        initial += int(np.sum(~np.isin(miss_block, written)))
        if capacity and miss.numel():
            admit(miss, dirty=False)
        pending.append(ids)
        if len(pending) > lag:
            store(pending.pop(0))
        ev = np.unique(np.concatenate(evicted_now)) if evicted_now else np.zeros(0, np.int64)
        evict_blocks.append(int(ev.size))
        written = np.union1d(written, ev)
    return CacheReplay(
        cache.hits, cache.misses, miss_blocks, evict_blocks, initial, cache.evictions
    )


# --- this machine's row costs ------------------------------------------------------------------


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
    from common.crc import crc32
    from embeddings.scm_cache import SlotMap

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
    from embeddings.hotline import hotline_collection

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
    return _row_us(figs, "load_fixed", row_floats) + rows * _row_us(figs, "load", row_floats)


@lru_cache(maxsize=1)
def staging_figures() -> dict:
    """`measure_staging`'s figures, cached per machine beside the hardware description."""
    from common.atomic import write_json
    from perfmodel.hardware import cache_dir, machine_key

    path = cache_dir() / f"staging-{machine_key()}.json"
    try:
        figs = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        figs = measure_staging()
    if "load_ns_16" in figs:
        return figs
    for rf in (16, 128):  # also where a figures file is from before the step's part was measured
        fixed_us, figs[f"load_ns_{rf}"] = measure_step_load(rf)
        figs[f"load_fixed_ns_{rf}"] = fixed_us * 1e3
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, figs)
    return figs


def _row_us(figs: dict, kind: str, row_floats: int) -> float:
    """Per-row time of a gather or scatter of `row_floats`-float rows, linear between 16 and 128."""
    a, b = figs[f"{kind}_ns_16"], figs[f"{kind}_ns_128"]
    return (a + (b - a) * (row_floats - 16) / 112) / 1e3


# --- the step itself ---------------------------------------------------------------------------


def _with(cfg, **changes):
    data = cfg.to_json()
    data.update(changes)
    return type(cfg).from_json(data)


def _fitted_model():
    from perfmodel import load_model
    from perfmodel.errors import ModelError

    try:
        return load_model()
    except ModelError:
        return None


_STEPS: dict[tuple, dict] = {}


def _capturable(cfg, total_rows: int):
    """The config the step graph is captured from (None: too large to build, and not synthetic)."""
    if total_rows <= CAPTURE_ROWS:
        return cfg
    if cfg.data_set != "synthetic":
        return None
    f = CAPTURE_ROWS / total_rows
    # smaller tables: a profile or plan of the real ones does not fit them (FAE makes its own)
    changes: dict[str, Any] = {"synthetic_table_scale": cfg.synthetic_table_scale * f,
                               "profile_file": None, "placement_plan": None}  # fmt: skip
    if cfg.arch_embedding_size:
        changes["arch_embedding_size"] = [max(1, int(n * f)) for n in cfg.arch_embedding_size]
    if cfg.placement == "fae":  # the same share of the (smaller) tables on the device
        changes["hot_budget"] = max(1, int(parse_bytes(cfg.hot_budget) * f))
    return _with(cfg, **changes)


# A device or host step runs the same operators whatever another placement's settings are: they
# are set to their defaults for the capture, so its graph (cached by the whole configuration) is
# captured once, not once per candidate (15 captures were 13 of a 14 s plan)
_UNPLACED = {k: v for k, v in TrainConfig().to_json().items()
             if k in ("hot_budget", "profile_sample_rate", "profile_file", "placement_plan",
                      "fae_switch_period", "fae_order", "hotline_prefetch",
                      "hotline_learn_batches") or k.startswith("scm_")}  # fmt: skip


def step_time(
    cfg, sizes: list[int], placement: str = "device", table_sizes: list[int] | None = None
) -> dict:
    """Predicted ms of `placement`'s training step (device, host or fae as captured) for a
    configuration of tables of `sizes` rows, with the embedding kernels over tables of
    `table_sizes` rows (default `sizes`; Hotline's device tier is smaller): {ms, dense, lookup,
    source}."""
    table_sizes = list(sizes if table_sizes is None else table_sizes)
    model = _fitted_model()
    total = int(sum(sizes))
    # the capture builds the step at batch 16, not the user's run: their memory limits are not its
    base = _with(cfg, placement=placement, memory_limit=None, device_memory_limit=None,
                 **(_UNPLACED if placement != "fae" else {}))  # fmt: skip
    proxy = _capturable(base, total) if model is not None else None
    if proxy is None:
        return roofline_step(cfg, table_sizes)
    from perfmodel.graph import graph_for, graph_key

    key = (graph_key(proxy), int(cfg.mini_batch_size), tuple(int(s) for s in table_sizes))
    if key in _STEPS:
        return _STEPS[key]
    graphs, meta = graph_for(proxy, cfg.mini_batch_size)
    total_ms = dense_ms = lookup_ms = 0.0
    for weight, ops in graphs.values():
        for op in ops:
            for k in op["kernels"]:
                if k.get("ctx") is not None and placement != "fae":
                    k["ctx"]["table_sizes"] = list(table_sizes)
        res = model.predict_ops(ops)
        w = weight / sum(w for w, _ in graphs.values())
        total_ms += w * res["per_batch_us"] / 1e3
        lookup_ms += w * res["breakdown"]["phase_us"].get("embedding_lookup", 0.0) / 1e3
    dense_ms = total_ms - lookup_ms
    out = {"ms": total_ms, "dense": dense_ms, "lookup": lookup_ms, "source": "fitted model",
           "hot_share": meta.get("hot_share")}  # fmt: skip
    _STEPS[key] = out
    return out


def _widths(text) -> list[int]:
    if not text:
        return []
    return [int(x) for x in (text if isinstance(text, (list, tuple)) else str(text).split("-"))]


def roofline_step(cfg, table_sizes: list[int]) -> dict:
    """Without a fitted model: GEMM flops at the measured peak, embedding bytes at the measured
    copy bandwidth, a fixed 1 ms of per-op overheads. Coarse: a fallback, marked as such."""
    from perfmodel.hardware import describe

    hw = describe()
    B = int(cfg.mini_batch_size)
    T = len(table_sizes)
    dim, rf, _ = _row_bytes(cfg)
    layers = [_widths(cfg.arch_mlp_bot), _widths(cfg.arch_mlp_top)]
    flops = sum(2 * B * a * b for w in layers for a, b in zip(w, w[1:]))
    flops += 2 * B * (T + 1) ** 2 * dim  # the dot interaction
    gflops = hw["matmul_gflops"].get(cfg.precision, hw["matmul_gflops"]["fp32"])
    dense = 3 * flops / (gflops * 1e9) * 1e3
    lookup_bytes = B * T * 4 * (dim + 2 * rf)  # forward read, backward read+write with state
    lookup = lookup_bytes / (hw["mem_bw_gbs"] / 2 * 1e9) * 1e3 + B * T * 30e-6
    return {"ms": dense + lookup + 1.0, "dense": dense + 1.0, "lookup": lookup,
            "source": "roofline (no fitted model)"}  # fmt: skip


def _spare_core() -> bool:
    """Does the process have a core beyond torch's intra-op threads for the staging worker?"""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return cores > torch.get_num_threads()


# --- the predictor -----------------------------------------------------------------------------


def predict_candidate(cfg, candidate: Candidate, sample) -> Prediction:
    sizes = [int(s) for s in sample.profile.table_sizes]
    kind = candidate.placement
    if kind in ("device", "host", "fae"):
        step = step_time(cfg, sizes, kind)
        parts = {"dense": step["dense"], "lookup": step["lookup"]}
        detail: dict[str, Any] = {"source": step["source"]}
        if kind == "fae":
            detail["hot_input_share"] = step.get("hot_share")
        if kind == "host" and torch.cuda.is_available():
            from perfmodel.hardware import describe

            hw = describe()
            dim = int(cfg.arch_sparse_feature_size)
            pooled = int(cfg.mini_batch_size) * len(sizes) * dim * 4
            parts["link"] = (
                pooled / (hw["d2h_gbs"] * 1e9) * 1e3 + pooled / (hw["h2d_gbs"] * 1e9) * 1e3
            )
            detail["link_bytes"] = 2 * pooled
        return Prediction(sum(parts.values()), parts, detail)
    return _staged(cfg, candidate, sample, sizes)


def _staged(cfg, candidate: Candidate, sample, sizes: list[int]) -> Prediction:
    dim, rf, opt = _row_bytes(cfg)
    row_bytes = 4 * rf
    plan = hot_plan(cfg, sample, candidate.hot_budget)
    batches = cold_batches(sample, plan)
    hot = [int(plan.tier("device").held_count(t)) for t in range(len(sizes))]
    rows = float(np.mean([b.cold.numel() for b in batches])) if batches else 0.0
    lookups = float(np.mean([b.lookups for b in batches])) if batches else 0.0
    cold_lookups = float(np.mean([b.cold_lookups for b in batches])) if batches else 0.0
    slots = [h + int(np.mean([b.cold_per_table[t] for b in batches])) if batches else h
             for t, h in enumerate(hot)]  # fmt: skip
    step = step_time(cfg, sizes, "device", slots)
    figs = staging_figures()
    gather, scatter = _row_us(figs, "gather", rf), _row_us(figs, "scatter", rf)
    # the worker: map every lookup, read the cold rows with their state
    mapping = float(np.mean([b.map_s for b in batches])) * 1e3 if batches else 0.0
    detail: dict[str, Any] = {
        "source": step["source"], "hot_rows": int(sum(hot)), "lookups_per_batch": lookups,
        "cold_lookups_per_batch": cold_lookups, "cold_rows_per_batch": rows,
        "gather_bytes_per_batch": rows * row_bytes, "writeback_bytes_per_batch": rows * row_bytes,
        "sample_batches": len(batches),
    }  # fmt: skip
    parts = {"dense": step["dense"], "lookup": step["lookup"]}
    # the step thread: the previous batch's rows home, this batch's renewed and into the slots,
    # as measured on a real collection (the renewal and the slots' bookkeeping are most of it)
    load = load_us(figs, rows, rf) / 1e3
    if candidate.placement == "hotline":
        staging = mapping + rows * gather / 1e3
        home = 0.0  # in `load`: the host tier's write-back was measured with it
    else:
        from perfmodel.disk import describe_disk, read_seconds

        total_rows = int(sum(sizes))
        capacity = min(candidate.scm_cache // row_bytes, total_rows - int(sum(hot)))
        rpb = PAYLOAD // row_bytes
        _, prio = seen_rows(sample.profile.counts, sizes)
        warm = warm_rows(sample.profile.counts, sizes, hot_row_map(plan), int(capacity),
                         max(int(rows), 1024))  # fmt: skip
        rep = replay_row_cache([b.cold for b in batches], total_rows, int(capacity), rpb, prio,
                               warm=warm)  # fmt: skip
        where = cfg.scm_dir or (Path(cfg.out_dir) / "scm" if cfg.out_dir else None)  # its default
        disk = describe_disk(where)
        depth = int(cfg.scm_io_depth)
        reads = float(np.mean(rep.miss_blocks)) if batches else 0.0
        rmw = float(np.mean(rep.evict_blocks)) if batches else 0.0
        read_s = np.mean([read_seconds(disk, n, depth) for n in rep.miss_blocks]) if batches else 0
        rmw_s = (
            np.mean([2 * read_seconds(disk, n, depth) for n in rep.evict_blocks]) if batches else 0
        )
        hit_rows = rows * (rep.hit_rate or 0.0)
        cpu = (rows * figs["hash_ns_per_row"] / 1e6 + hit_rows * gather / 1e3
               + (reads + rmw) * figs["crc_us_per_block"] / 1e3 + rmw * rpb * scatter / 1e3)  # fmt: skip
        parts["disk"] = float(read_s + rmw_s) * 1e3
        staging = mapping + cpu  # the worker's CPU; its disk time is the `disk` part
        # `load` measured the host tier's write-back (a scatter); the SSD tier's queued one
        # hashes each row as well
        home = rows * figs["hash_ns_per_row"] / 1e6
        detail.update(
            hit_rate=rep.hit_rate, cache_rows=int(capacity), reads_per_step=reads,
            rmw_blocks_per_step=rmw, bytes_read_per_step=(reads + rmw) * 4096,
            bytes_written_per_step=rmw * 4096, rows_per_block=rpb,
            initial_share=rep.initial_misses / rep.misses if rep.misses else 0.0,
            disk_io=disk["io"], disk_engine=disk["engine"], disk_key=disk["key"],
        )  # fmt: skip
    parts["load"] = load + home
    parts["staging"] = staging
    prefetch = int(getattr(cfg, "hotline_prefetch", 1) or 0)
    compute = step["ms"] + parts["load"]
    spare = _spare_core()
    worker = staging + parts.get("disk", 0.0)  # one staging at a time: it hides up to a step
    hidden = min(worker, compute) if prefetch and spare else 0.0
    parts["hidden"] = -hidden
    detail.update(prefetch=prefetch, spare_core=spare, staging_ms=worker, hidden_ms=hidden)
    ms = sum(parts.values())
    return Prediction(float(ms), {k: float(v) for k, v in parts.items()}, detail)


register_predictor(predict_candidate)
