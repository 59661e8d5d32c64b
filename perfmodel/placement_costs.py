"""The placement planner's step costs: the pieces each placement kind's prediction is made of
(dlrm/placement/candidates.py's `StepCosts`, dlrm/placement/kinds.py's `predict`).

`PlacementCosts()` is one plan's: what it memoises (a hot set's plan and map, the cold rows of
each batch, a captured step) lives in the planning sample's `memo` and in the object, keyed by
value, and goes with the plan. The planner finds its factory through the plugin module
(perfmodel/recorder.py's `PLACEMENT_COSTS`); `predict_candidate(cfg, candidate, sample)` is a
fresh object's prediction of one candidate. `sample` is the planning sample: `.profile` (an `embeddings.profile.AccessProfile`) and `.batches` (the sparse
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
  `--hotline-prefetch` >= 1 the worker's part overlaps the step: hidden = min(staging, step + load) when
  the process has a core beyond torch's threads (2 cores, 1 torch thread: yes); without a spare
  core the worker takes the step's core and nothing is hidden.
- tiered: Hotline's, with the cold rows read from the SSD tier behind the DRAM row cache, over
  the steps the prediction stands for (`sample.steps`: the run's, from its first): the cache
  starts empty and the tier file unwritten, so hits, misses and the blocks read and patched per
  step come from the cache's real policy replayed on the run's first batches
  (`sample.stream()`), extrapolated over the rest of the run (perfmodel/row_cache_model.py);
  their time from the disk's measured IOPS at the tier's queue depth (`perfmodel.disk`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlrm.placement.auto_check import MEASURE_STEPS
from dlrm.placement.candidates import Candidate, KindPredictor, Prediction, StepTime
from dlrm.settings.model import ArchConfig
from dlrm.settings.sections import TrainingConfig
from embeddings.config import SparseOptimizer
from embeddings.hot_map import HotRowMap
from embeddings.hot_rows import plan_placement
from embeddings.row_layout import table_row_base
from embeddings.ssd.file import PAYLOAD
from embeddings.ssd.log import patch_share, split_cache
from embeddings.staged.lookup_map import map_lookups
from perfmodel.capture_config import CAPTURE_ROWS  # noqa: F401 (the module doc's, the tests')
from perfmodel.capture_config import UNPLACED as _UNPLACED
from perfmodel.capture_config import capturable as _capturable
from perfmodel.row_cache_model import (
    replay_row_cache,
    run_io,
    seen_rows,
    stream_replay,
    warm_rows,
)
from perfmodel.staging_costs import load_us, row_us, staging_figures

log = logging.getLogger(__name__)


# --- the planning sample, replayed -------------------------------------------------------------


@dataclass
class ColdBatch:
    lookups: int  # every lookup of the batch
    cold_lookups: int  # lookups of rows not in the device tier
    cold: torch.Tensor  # the unique cold rows' global ids, sorted (what a staging reads)
    cold_per_table: list[int]  # unique cold rows per table
    map_s: float  # the worker's mapping of the batch (embeddings/staged/lookup_map.py), timed here


def _row_bytes(arch: ArchConfig, training: TrainingConfig) -> tuple[int, int, SparseOptimizer]:
    opt = training.sparse_optimizer()
    dim = int(arch.sparse_feature_size)
    return dim, dim + opt.state_floats(dim), opt


class _NoMemo:
    """A sample without a plan's memo (a test's stand-in): nothing is kept."""

    def get(self, key: tuple, make):
        return make()


def _memo(sample):
    memo = getattr(sample, "memo", None)
    return memo if memo is not None else _NoMemo()


def hot_plan(sample, hot_budget: int, dim: int, opt: SparseOptimizer):
    """The one-home plan Hotline and tiered runs make at `hot_budget` of rows of width `dim`
    (memoised in the sample's plan memo)."""
    dims = [dim] * sample.profile.num_tables
    return _memo(sample).get(
        ("plan", dim, opt.kind, int(hot_budget)),
        lambda: plan_placement(
            sample.profile, dims, opt, int(hot_budget), one_home=True, report=False
        ),  # fmt: skip
    )


def hot_row_map(plan) -> HotRowMap:
    """The device tier's map of a plan's hot rows, as the staged collection builds it."""
    base = table_row_base(plan.table_sizes)
    tables, rows = plan.hot_ids()
    gids = torch.from_numpy(np.sort(rows + base.numpy()[tables]))
    return HotRowMap(gids, base, int(sum(plan.table_sizes)))


def cold_batches(
    batches: list, plan, timed: bool = True, hot: HotRowMap | None = None
) -> list[ColdBatch]:
    """Each batch (sparse features) mapped as the staging worker maps it (`map_lookups`, the same
    code): its unique cold rows, and with `timed` the time the mapping took on this machine (best
    of two: the first call of a process compiles). `hot`: the plan's map, where made already."""
    hot = hot if hot is not None else hot_row_map(plan)
    sizes = np.asarray(plan.table_sizes, dtype=np.int64)
    base = table_row_base(plan.table_sizes).numpy()
    n_hot = hot.n_hot.numpy()
    out = []
    for kjt in batches:
        values = kjt.values().numpy()
        lengths = kjt.lengths().numpy()
        best = float("inf")
        for _ in range(2 if timed else 1):
            t0 = time.perf_counter()
            m = map_lookups(values, lengths, kjt.stride(), sizes, base, hot)
            best = min(best, time.perf_counter() - t0)
        table_of = np.repeat(np.arange(sizes.size), lengths.reshape(sizes.size, -1).sum(1))
        cold_lookups = int(np.sum(m.slots >= n_hot[table_of]))
        out.append(ColdBatch(int(values.size), cold_lookups, torch.from_numpy(m.cold_gids),
                             [int(x) for x in m.per_table], best))  # fmt: skip
    return out


def _staged_rows(sample, hot_budget: int, dim: int, opt: SparseOptimizer):
    """(plan, its map, the sample's batches mapped) at `hot_budget`, memoised for the plan."""
    key = ("staged", dim, opt.kind, int(hot_budget))

    def make():
        plan = hot_plan(sample, hot_budget, dim, opt)
        hot = hot_row_map(plan)
        return plan, hot, cold_batches(sample.batches, plan, hot=hot)

    return _memo(sample).get(key, make)


# --- the step itself ---------------------------------------------------------------------------


def _fitted_model(cfg=None, sizes: list[int] | None = None):
    """The fully fitted model when the user made one, else the calibration of the run's shapes
    (measured now when absent: perfmodel/calibration.py); None (the roofline, labelled so) when
    calibration is off or failed, after one line saying why."""
    from perfmodel.errors import CalibrationOff, ModelError
    from perfmodel.model import load_model

    try:
        return load_model(cfg=cfg, table_sizes=sizes)
    except CalibrationOff:  # asked for (the tests' fast tier): the table says "roofline"
        return None
    except ModelError as e:
        if cfg is not None:
            log.warning("no performance model (%s): predicting from the roofline", e)
        return None
    except (RuntimeError, ValueError, OSError) as e:  # a calibration that could not run here
        log.warning(
            "calibration failed (%s: %s): predicting from the roofline", type(e).__name__, e
        )
        return None


def step_time(
    cfg,
    sizes: list[int],
    placement: str = "device",
    table_sizes: list[int] | None = None,
    memo=None,
) -> dict:
    """Predicted ms of `placement`'s training step (device, host or fae as captured) for a
    configuration of tables of `sizes` rows, with the embedding kernels over tables of
    `table_sizes` rows (default `sizes`; Hotline's device tier is smaller): {ms, dense, lookup,
    source}. `memo`: the plan's (PlanMemo), where captured steps are kept for its candidates."""
    table_sizes = list(sizes if table_sizes is None else table_sizes)
    model = _fitted_model(cfg, sizes)
    # the capture builds the step at batch 16, not the user's run: their memory limits and its
    # length are not its (an FAE capture looks for both kinds of batch in the whole epoch)
    base = cfg.replace(placement=placement, memory_limit=None, device_memory_limit=None,
                       num_batches=0, **(_UNPLACED if placement != "fae" else {}))  # fmt: skip
    proxy = _capturable(base, sizes) if model is not None else None
    if proxy is None:
        return roofline_step(cfg, table_sizes)
    from perfmodel.graph import graph_key

    key = ("step", graph_key(proxy), int(cfg.training.mini_batch_size),
           tuple(int(s) for s in table_sizes))  # fmt: skip
    return (memo if memo is not None else _NoMemo()).get(key, lambda: _predicted_step(model, proxy, cfg, placement,
                                                                table_sizes))  # fmt: skip


def _predicted_step(model, proxy, cfg, placement: str, table_sizes: list[int]) -> dict:
    from perfmodel.graph import graph_for

    graphs, meta = graph_for(proxy, cfg.training.mini_batch_size)
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
    return {"ms": total_ms, "dense": dense_ms, "lookup": lookup_ms, "source": "fitted model",
            "hot_share": meta.get("hot_share")}  # fmt: skip


def _widths(text) -> list[int]:
    if not text:
        return []
    return [int(x) for x in (text if isinstance(text, (list, tuple)) else str(text).split("-"))]


def roofline_step(cfg, table_sizes: list[int]) -> dict:
    """Without a fitted model: GEMM flops at the measured peak, embedding bytes at the measured
    copy bandwidth, a fixed 1 ms of per-op overheads. Coarse: a fallback, marked as such."""
    from perfmodel.hardware import describe

    hw = describe()
    B = int(cfg.training.mini_batch_size)
    T = len(table_sizes)
    dim, rf, _ = _row_bytes(cfg.arch, cfg.training)
    layers = [_widths(cfg.arch.mlp_bot), _widths(cfg.arch.mlp_top)]
    flops = sum(2 * B * a * b for w in layers for a, b in zip(w, w[1:]))
    flops += 2 * B * (T + 1) ** 2 * dim  # the dot interaction
    gflops = hw["matmul_gflops"].get(cfg.training.precision, hw["matmul_gflops"]["fp32"])
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


# --- the step costs ----------------------------------------------------------------------------


class PlacementCosts:
    """One plan's step costs (dlrm/placement/candidates.py's `StepCosts`): the kinds' predictions
    are made of these. What they share is memoised in the planning sample's memo."""

    def captured(self, cfg, sample, placement: str) -> Prediction:
        """`placement`'s step as captured (device, host, fae) and predicted whole."""
        sizes = [int(s) for s in sample.profile.table_sizes]
        if placement == "fae" and not cfg.placing.profile_file:
            # the profile the planner made (dlrm/placement/run_plan.py): an FAE capture over the
            # same tables plans its hot set from it, as the run will, instead of profiling the
            # epoch again at the capture's batch of 16 (6 s for the README's tables)
            from dlrm.placement.run_plan import PROFILE_NAME

            made = cfg.run_dir / PROFILE_NAME
            if made.is_file():
                cfg = cfg.replace(profile_file=str(made))
        step = step_time(cfg, sizes, placement, memo=getattr(sample, "memo", None))
        detail: dict[str, Any] = {"source": step["source"]}
        if placement == "fae":
            detail["hot_input_share"] = step.get("hot_share")
        return Prediction.of(StepTime(dense=step["dense"], lookup=step["lookup"]), detail)

    def link(self, cfg, sample) -> tuple[float, int]:
        """(ms, bytes): the pooled embeddings to the device and their gradients back at the
        measured pinned-copy bandwidth; (0, 0) without CUDA (nothing crosses a link)."""
        if not torch.cuda.is_available():
            return 0.0, 0
        from perfmodel.hardware import describe

        hw = describe()
        dim = int(cfg.arch.sparse_feature_size)
        pooled = int(cfg.training.mini_batch_size) * sample.profile.num_tables * dim * 4
        ms = pooled / (hw["d2h_gbs"] * 1e9) * 1e3 + pooled / (hw["h2d_gbs"] * 1e9) * 1e3
        return ms, 2 * pooled

    def staged(self, cfg, candidate: Candidate, sample, cold: str) -> Prediction:
        """The device step over the hot rows and each batch's staged cold rows, read from host
        DRAM (`cold` "host": Hotline) or the SSD tier behind its row cache ("disk": tiered)."""
        sizes = [int(s) for s in sample.profile.table_sizes]
        return _staged(cfg, candidate, sample, sizes, cold)


def predict_candidate(cfg, candidate: Candidate, sample) -> Prediction:
    """`candidate`'s prediction by its kind from a fresh plan's step costs."""
    return KindPredictor(PlacementCosts())(cfg, candidate, sample)


def _staged(cfg, candidate: Candidate, sample, sizes: list[int], cold: str) -> Prediction:
    dim, rf, opt = _row_bytes(cfg.arch, cfg.training)
    row_bytes = 4 * rf
    plan, hot_map, batches = _staged_rows(sample, candidate.hot_budget, dim, opt)
    hot = [int(plan.tier("device").held_count(t)) for t in range(len(sizes))]
    rows = float(np.mean([b.cold.numel() for b in batches])) if batches else 0.0
    lookups = float(np.mean([b.lookups for b in batches])) if batches else 0.0
    cold_lookups = float(np.mean([b.cold_lookups for b in batches])) if batches else 0.0
    slots = [h + int(np.mean([b.cold_per_table[t] for b in batches])) if batches else h
             for t, h in enumerate(hot)]  # fmt: skip
    step = step_time(cfg, sizes, "device", slots, memo=getattr(sample, "memo", None))
    figs = staging_figures()
    gather, scatter = row_us(figs, "gather", rf), row_us(figs, "scatter", rf)
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
    first = None  # a tiered prediction's disk and worker over the checked steps
    disk_steps: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # per window: ms per step, weights
    if cold == "host":
        staging = mapping + rows * gather / 1e3
        home = 0.0  # in `load`: the host tier's write-back was measured with it
    else:
        from perfmodel.disk import describe_disk, read_seconds

        total_rows = int(sum(sizes))
        cold_rows = total_rows - int(sum(hot))
        rpb = PAYLOAD // row_bytes
        # the write-back log's map comes out of the cache's bytes; its sweeps patch fewer blocks
        cache_rows, live = split_cache(
            int(candidate.scm_cache), row_bytes, rpb, cfg.scm.log_share, cold_rows
        )
        capacity = int(min(cache_rows, cold_rows))
        patch_scale = patch_share(live, cold_rows, rpb)
        memo = _memo(sample)
        ranked, prio = memo.get(("seen rows", tuple(sizes)),
                                lambda: seen_rows(sample.profile.counts, sizes))  # fmt: skip
        # the tier file's layout as the run would write it: the blocks each miss falls in
        from dlrm.placement.tiered_setup import tier_layout
        from embeddings.ssd.layout import count_levels

        levels = memo.get(("count levels", tuple(sizes)),
                          lambda: count_levels(sample.profile.counts))  # fmt: skip
        layout = memo.get(
            ("layout", cfg.scm.layout, dim, opt.kind, int(candidate.hot_budget),
             int(candidate.scm_cache)),
            lambda: tier_layout(cfg.scm, sample.profile, plan, int(candidate.scm_cache), levels),
        )  # fmt: skip
        # the profile-ranked steady state: what the full cache keeps at least
        warm = warm_rows(ranked, hot_map, capacity, max(int(rows), 1024))
        floor = 0.0
        if warm:
            floor = replay_row_cache([b.cold for b in batches], total_rows, capacity, rpb, prio,
                                     warm=warm, layout=layout).hit_rate or 0.0  # fmt: skip
        # the run's first batches (a sample without them: its spread batches, as if in a row)
        first_batches = sample.stream() or sample.batches
        stream = [b.cold for b in _memo(sample).get(
            ("stream", dim, opt.kind, int(candidate.hot_budget)),
            lambda: cold_batches(first_batches, plan, timed=False, hot=hot_map))]  # fmt: skip
        where = cfg.scm.directory or (
            Path(cfg.run.out_dir) / "scm" if cfg.run.out_dir else None
        )  # its default
        disk = describe_disk(where)
        depth = int(cfg.scm.io_depth)
        seconds = lambda n: read_seconds(disk, n, depth)  # noqa: E731

        replayed = stream_replay(stream, total_rows, capacity, rpb, prio, layout)  # both windows'

        def io_parts(window) -> tuple[float, float, Any]:
            """(disk ms, the worker's CPU ms, the cache's figures) per step over `window`."""
            io = run_io(stream, total_rows, cold_rows, capacity, rpb, prio, window, seconds,
                        steady_floor=floor, replayed=replayed, layout=layout,
                        patch_scale=patch_scale)  # fmt: skip
            cpu = (rows * figs["hash_ns_per_row"] / 1e6 + rows * io.hit_rate * gather / 1e3
                   + (io.reads + io.rmw) * figs["crc_us_per_block"] / 1e3
                   + io.rmw * rpb * scatter / 1e3)  # fmt: skip
            disk_steps[tuple(window)] = (io.disk_by_step * 1e3, io.step_weights)
            return io.disk_s * 1e3, mapping + cpu, io

        parts["disk"], staging, io = io_parts(sample.steps)
        # the steps the placement check measures, where they are not the prediction's
        checked = (0, min(MEASURE_STEPS, sample.steps[1]))
        if tuple(sample.steps) != checked:
            first = io_parts(checked)
        # `load` measured the host tier's write-back (a scatter); the SSD tier's queued one
        # hashes each row as well
        home = rows * figs["hash_ns_per_row"] / 1e6
        detail.update(
            hit_rate=io.hit_rate, steady_hit_rate=io.steady_hit_rate, cache_full_at_step=io.fill_step,
            steps=list(sample.steps), replayed_steps=io.replayed_steps, cache_rows=capacity,
            misses_per_step=io.misses, reads_per_step=io.reads, rmw_blocks_per_step=io.rmw,
            bytes_read_per_step=(io.reads + io.rmw) * 4096, bytes_written_per_step=io.rmw * 4096,
            rows_per_block=rpb, scm_layout=layout.kind if layout else "identity",
            disk_io=disk["io"], disk_engine=disk["engine"], disk_key=disk["key"],
        )  # fmt: skip
    parts["load"] = load + home
    parts["staging"] = staging
    prefetch = int(cfg.hotline.prefetch or 0)
    compute = step["ms"] + parts["load"]
    spare = _spare_core()

    def hidden_ms(worker: float, window=None) -> float:
        """One staging at a time: it hides up to a step, step by step (a tiered run's disk time
        comes in bursts once its cache is full; their mean would hide too much)."""
        if not (prefetch and spare):
            return 0.0
        if window in disk_steps:
            ms, w = disk_steps[window]
            cpu = worker - float(np.average(ms, weights=w))  # the worker's CPU: the same each step
            return float(np.average(np.minimum(cpu + ms, compute), weights=w))
        return min(worker, compute)

    worker = staging + parts.get("disk", 0.0)
    parts["hidden"] = -hidden_ms(worker, tuple(sample.steps) if disk_steps else None)
    detail.update(
        prefetch=prefetch, spare_core=spare, staging_ms=worker, hidden_ms=-parts["hidden"]
    )
    ms = sum(parts.values())
    if first is not None:  # the same sum with the first steps' disk and worker
        w = first[0] + first[1]
        detail["checked_steps"] = list(checked)
        detail["checked_ms"] = ms - worker - parts["hidden"] + w - hidden_ms(w, checked)
    return Prediction(float(ms), StepTime(**{k: float(v) for k, v in parts.items()}), detail)
