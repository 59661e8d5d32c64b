"""The performance model calibrated in seconds at a run's own shapes, the first time a plan or a
prediction needs one on this machine (`model_for`); the full microbenchmark and fit
(`python -m perfmodel microbench` and `fit`, 10-15 minutes) stays for the report.

What the planner's predictions read, measured at the run's shapes only (`measure`), within a
hard time budget (`BUDGET_S`; fewer repeats when the machine is slow, never fewer than one of
each):

- one training step of the run itself (device placement; tables over `TRACE_TABLE_BYTES` scaled
  down as the planner's step graphs are, `perfmodel.capture_config.capturable`), warmed up and
  profiled: every kernel at the run's shapes inside a real step, the host overheads, and the
  in-situ factors (`KernelModels.calibrate_in_situ`);
- each distinct GEMM of that step (MLP layers forward and backward, DCN's cross layers, the
  interaction's bmm) again in isolation, timed directly, as the full ``gemm`` sweep does;
- the fused embedding lookup forward and backward with the run's optimizer, dimension, batch and
  bags, over the run's tables scaled from the caches' size to the run's own (up to
  `MAX_TABLE_BYTES`): the cache effect the FAE, Hotline and device placements differ by;
- the machine-wide figures, each cached per machine by its own module and measured only when
  absent: the hardware description (`perfmodel.hardware`, a quick one here), a staging's row
  costs (`perfmodel.staging_costs`) and the SSD tier's disk (`perfmodel.disk`).

The model is fitted by the full fit's own code (`PerfModel.from_measurements`) on these records:
one model form. It is cached per machine (`machine_key`) and software stack (`stack_versions`: a
new torch, fbgemm or torchrec recalibrates) in one JSON file, one entry per shape set
(`shape_key`): a run with other shapes calibrates its own and keeps the others. A file that is
not a calibration (corrupt, foreign, of another machine) is one line and a recalibration.

``HYBRID_DLRM_CALIBRATE=off`` turns calibration off (`enabled`): predictions without a fully
fitted model then come from the roofline, labelled so. The test suite sets it (tests/conftest.py)
so that every test that plans does not spend seconds calibrating.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from perfmodel.errors import ModelError
from perfmodel.machine_cache import cache_dir, machine_key

log = logging.getLogger(__name__)

FORMAT = "hybrid-perfmodel-calibration"
VERSION = 1
BUDGET_S = 25.0  # the whole calibration, machine-wide figures included: 30 s on 2 cores, with room
ENV = "HYBRID_DLRM_CALIBRATE"
MAX_TABLE_BYTES = 128 << 20  # the largest embedding draw: well past a last-level cache
# The traced step's tables at most (scaled down past it as the planner's step graphs are): its
# overheads and in-situ factors do not depend on them; building MLPerf's 4M captured rows of 128
# floats with Adagrad's state took 40 s here
TRACE_TABLE_BYTES = 64 << 20
SHORT_STEP_S = 0.25  # a step this short is profiled twice whatever the budget (the first dropped)
STACK_PACKAGES = ("torch", "fbgemm_gpu", "fbgemm-gpu-cpu", "torchrec", "numpy")

# The settings that decide which kernels a step runs at which shapes. The placement's own
# settings are not among them: every candidate of a plan reads one calibration.
SHAPE_FIELDS = (
    "model", "arch_sparse_feature_size", "arch_mlp_bot", "arch_mlp_top", "arch_interaction_op",
    "arch_interaction_itself", "dcn_num_layers", "dcn_low_rank_dim", "embedding_backend",
    "ts_length", "model_type", "tsl_inner", "tsl_mechanism", "tsl_num_heads", "tsl_mlp",
    "arch_mlp", "tsl_proj", "mha_num_heads", "rnn_num_layers", "synthetic_zipf",
    "multi_hot_sizes", "multi_hot_distribution", "mini_batch_size", "optimizer",
    "loss_function", "precision", "flush_denormal",
)  # fmt: skip


def _setting() -> str:
    return os.environ.get(ENV, "on").strip().lower()


def enabled() -> bool:
    """Whether a prediction without a fully fitted model may calibrate one (`ENV`: ``off``,
    ``on`` or a budget in seconds)."""
    return _setting() not in ("0", "off", "no", "false")


def budget_s() -> float:
    """The calibration's time budget: `ENV` when it is a number of seconds, else `BUDGET_S`
    (either cut to the walk's under HYBRID_DLRM_QUICK, hybrid_dlrm/common/quick.py)."""
    from hybrid_dlrm.common import quick

    try:
        seconds = max(float(_setting()), 0.0)
    except ValueError:
        seconds = BUDGET_S
    return quick.limit("calibration seconds", seconds)


def stack_versions() -> dict[str, str]:
    """The software a calibration's figures belong to: another version of any recalibrates."""
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": str(torch.version.cuda)}  # fmt: skip
    for name in STACK_PACKAGES[1:]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def shapes_of(cfg, table_sizes: list[int]) -> dict:
    """The run's shapes: what `measure` measures and the cache is keyed by."""
    from dlrm.build import resolve_device

    data = cfg.to_json()
    shapes = {k: data[k] for k in SHAPE_FIELDS if k in data}
    shapes["table_sizes"] = [int(n) for n in table_sizes]
    shapes["device"] = resolve_device(cfg.training.device).type
    shapes["threads"] = torch.get_num_threads()
    return shapes


def shape_key(shapes: dict) -> str:
    return hashlib.sha1(json.dumps(shapes, sort_keys=True).encode()).hexdigest()[:16]


def calibration_path() -> Path:
    return cache_dir() / f"calibration-{machine_key()}.json"


# --- the cache file ----------------------------------------------------------------------------


def _empty() -> dict:
    return {"format": FORMAT, "version": VERSION, "machine": machine_key(),
            "stack": stack_versions(), "shape_sets": {}}  # fmt: skip


def read_cache(path: Path | None = None, say=None) -> dict:
    """The calibration file's content, or an empty one (after one line through `say`, default
    stderr) when it is corrupt, not a calibration, another machine's or another stack's."""
    from hybrid_dlrm.common.header import check_header

    path = path or calibration_path()
    say = say or _say
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return _empty()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        say(f"{path}: not a readable calibration ({type(e).__name__}); recalibrating")
        return _empty()
    try:
        check_header(doc, path, format=FORMAT, versions=(VERSION,), kind="calibration",
                     error=ModelError)  # fmt: skip
        if not isinstance(doc.get("shape_sets"), dict):
            raise ModelError(f"{path}: not a calibration (no shape sets)")
    except ModelError as e:
        say(f"{e}; recalibrating")
        return _empty()
    if doc.get("machine") != machine_key():
        say(f"{path}: calibrated on another machine; recalibrating")
        return _empty()
    now = stack_versions()
    if doc.get("stack") != now:
        old = doc.get("stack") or {}
        changed = ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in now.items() if old.get(k) != v)
        say(f"{path}: the software changed since calibration ({changed}); recalibrating")
        return _empty()
    return doc


def write_cache(doc: dict, path: Path | None = None) -> Path:
    from hybrid_dlrm.common.atomic import write_json

    path = path or calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, doc, indent=None)
    return path


def _say(line: str) -> None:
    # stderr: `perfmodel predict --json` and `plan --json` keep stdout for their one object
    print(line, file=sys.stderr, flush=True)


# --- the model for a run -----------------------------------------------------------------------

_MODELS: dict[str, Any] = {}


def model_for(cfg, table_sizes: list[int], model_class, seconds: float | None = None, say=None):
    """The calibrated model of `cfg`'s shapes on tables of `table_sizes` rows: from the cache,
    else measured now (one line when it starts, one when it ends) and cached. `model_class` is
    `perfmodel.model.PerfModel` (passed in by `load_model`, which chooses between a fitted model
    and this one: the model's module does not import this one back)."""
    shapes = shapes_of(cfg, table_sizes)
    key = shape_key(shapes)
    path = calibration_path()
    seconds = budget_s() if seconds is None else seconds
    memo = f"{path}|{key}"
    if memo in _MODELS:
        return _MODELS[memo]
    say = say or _say
    doc = read_cache(path, say)
    entry = doc["shape_sets"].get(key)
    model = None
    if entry is not None:
        try:
            model = model_class.from_json(entry["model"], f"{path} (shape set {key})")
        except (ModelError, KeyError, TypeError) as e:
            say(f"{path}: shape set {key} unreadable ({e}); recalibrating")
    if model is None:
        say(f"calibrating the performance model for this machine at the run's shapes (about "
            f"{seconds:.0f} s; once per machine, cached in {path})")  # fmt: skip
        t0 = time.perf_counter()
        recs, docs, hw, counts = measure(cfg, table_sizes, seconds)
        model = model_class.from_measurements(recs, docs, hw, gemm_mlp=False)
        took = time.perf_counter() - t0
        model.fit_info["calibration_run"] = dict(counts, seconds=round(took, 2), budget_s=seconds)
        doc = read_cache(path, lambda _line: None)  # another process may have added a set
        doc["shape_sets"][key] = {"shapes": shapes, "model": model.to_json(),
                                  "measured": counts, "seconds": round(took, 2)}  # fmt: skip
        write_cache(doc, path)
        say(f"calibrated in {took:.1f} s ({counts['trace_steps']} profiled steps, "
            f"{counts['gemms']} GEMMs, {counts['embedding_draws']} embedding draws)")  # fmt: skip
    _MODELS[memo] = model
    return model


# --- what is measured ---------------------------------------------------------------------------


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.perf_counter(), float(seconds)

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


def measure(cfg, table_sizes: list[int], budget_s: float = BUDGET_S):
    """(kernel records, trace documents, hardware description, counts) of `cfg`'s shapes within
    `budget_s` seconds: the machine-wide figures first (cached after their first time), then the
    run's step, its GEMMs and its embedding lookups, each with as many repeats as the time left
    allows and at least one."""
    from dlrm.build import resolve_device
    from perfmodel import hardware
    from perfmodel import sweeps as S

    deadline = Deadline(budget_s)
    counts: dict[str, Any] = {}
    lap = _laps(counts.setdefault("phase_s", {}), counts.setdefault("phase_cpu_s", {}))
    counts["hardware"] = "cached" if hardware.default_path().exists() else "measured"
    hw = hardware.describe(quick=True)  # quick when absent: `perfmodel microbench` redoes it
    lap("hardware")
    counts["staging"] = _staging()
    lap("staging")
    counts["disk"] = _disk(cfg)
    lap("disk")
    device = resolve_device(cfg.training.device)
    saved_device, S.DEVICE = S.DEVICE, device
    threads = torch.get_num_threads()
    try:
        doc = _trace(cfg, table_sizes, hw, device, deadline)
        docs = [doc] if doc is not None else []
        counts["trace_steps"] = len(doc["steps"]) if doc is not None else 0
        lap("trace")
        recs = _gemms(doc, int(cfg.training.mini_batch_size), deadline) if doc else []
        counts["gemms"] = len(recs)
        lap("gemms")
        emb, counts["embedding_draws"] = _embeddings(cfg, table_sizes, hw, device, deadline)
        recs += emb
        lap("embeddings")
    finally:
        S.DEVICE = saved_device
        torch.set_num_threads(threads)
    return recs, docs, hw, counts


def _laps(wall: dict, cpu: dict):
    """lap(name): the wall and process-CPU seconds since the last lap, into `wall[name]` and
    `cpu[name]` (where a calibration's time went, kept with it: on a busy machine the two
    differ by the neighbours' share)."""
    last = [time.perf_counter(), time.process_time()]

    def lap(name: str) -> None:
        now = [time.perf_counter(), time.process_time()]
        wall[name], cpu[name] = round(now[0] - last[0], 2), round(now[1] - last[1], 2)
        last[:] = now

    return lap


def _staging() -> str:
    from perfmodel.staging_costs import staging_figures

    cached = (cache_dir() / f"staging-{machine_key()}.json").exists()
    staging_figures(quick=True)
    return "cached" if cached else "measured"


def _disk(cfg) -> str:
    """The SSD tier's disk where the run would put it (as the planner reads it)."""
    from embeddings.errors import ScmError
    from perfmodel.disk import default_path, describe_disk

    where = cfg.scm.directory or (Path(cfg.run.out_dir) / "scm" if cfg.run.out_dir else None)
    try:
        cached = default_path(where or _tmp()).exists()
        describe_disk(where)
    except (OSError, ScmError) as e:
        return f"unavailable ({e})"
    return "cached" if cached else "measured"


def _tmp() -> str:
    import tempfile

    return tempfile.gettempdir()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _trace(cfg, table_sizes, hw, device, deadline: Deadline, share: float = 0.4) -> dict | None:
    """A perf trace of the run's own step (device placement, at the run's batch): one or two
    warm-up steps, then 1-3 profiled ones (of two or more, the first dropped), as many as
    `share` of the time left allows. None
    when the run's step cannot be built here (tables too large, no synthetic stand-in)."""
    from perfmodel import hardware
    from perfmodel import trace as tr
    from perfmodel.capture_config import UNPLACED, capturable
    from perfmodel.graph import batches_for, build_trainer
    from perfmodel.profiling import profile_steps, run_steps, trace_meta

    base = cfg.replace(placement="device", memory_limit=None, device_memory_limit=None,
                       **UNPLACED)  # fmt: skip
    opt = cfg.training.sparse_optimizer()
    dim = int(cfg.arch.sparse_feature_size)
    rows = max(int(TRACE_TABLE_BYTES // (4 * (dim + opt.state_floats(dim)))), len(table_sizes))
    proxy = capturable(base, list(table_sizes), rows)
    if proxy is None:
        return None
    batch = int(cfg.training.mini_batch_size)
    threads = torch.get_num_threads()
    trainer = build_trainer(proxy)
    bs = batches_for(trainer, batch, 5)
    torch.set_num_threads(threads)  # numba's OpenMP layer may have changed it
    t0 = time.perf_counter()
    run_steps(trainer.pipeline, bs[:1])
    _sync(device)
    step_s = time.perf_counter() - t0
    # a profiled step costs about 1.5 plain ones; the first step paid one-off costs too
    fits = int(deadline.left() * share / max(1.5 * step_s, 1e-3))
    if fits >= 4:
        run_steps(trainer.pipeline, bs[1:2])
    # the first profiled step pays the profiler's start (ms before its first op): dropped where
    # that is a share of a step worth measuring again
    k = min(max(fits, 1), 3)
    k = 2 if k == 1 and step_s < SHORT_STEP_S else k
    graphs = profile_steps(trainer.pipeline, bs[2 : 2 + k], device.type == "cuda")
    graphs = graphs[1:] if k > 1 else graphs
    meta = trace_meta(trainer, batch)
    meta["machine_slowdown"] = hardware.slowdown(hw)
    return tr.make_doc(meta, graphs)


_DTYPES = {"float": torch.float32, "c10::BFloat16": torch.bfloat16, "c10::Half": torch.float16,
           "double": torch.float64}  # fmt: skip
_GEMM_CALLS = {"aten::addmm": torch.addmm, "aten::mm": torch.mm, "aten::bmm": torch.bmm}


def _operand(shape, stride, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of `shape` laid out with `stride` (a transposed view stays one)."""
    span = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 1
    return torch.randn(span, device=device).to(dtype).as_strided(shape, stride)


def _gemms(doc: dict, batch: int, deadline: Deadline, share: float = 0.5) -> list[dict]:
    """Each distinct GEMM of the traced step timed alone (`sweeps.time_call`), as a record of
    the ``gemm`` sweep: repeats as `share` of the time left allows (1-7)."""
    from perfmodel import sweeps as S
    from perfmodel.graph import records_from_trace

    todo: dict[str, tuple] = {}
    for r in records_from_trace(doc):
        call = _GEMM_CALLS.get(r["name"])
        dtypes = [_DTYPES.get(d) for d in (r.get("dtypes") or [])]
        n = {"aten::addmm": 3}.get(r["name"], 2)
        shapes, strides = r.get("shapes") or [], r.get("strides") or []
        if call is None or len(shapes) < n or len(strides) < n or None in dtypes[:n]:
            continue
        key = json.dumps([r["name"], shapes[:n], strides[:n], r["dtypes"][:n]])
        todo.setdefault(key, (call, shapes[:n], strides[:n], dtypes[:n], float(r["dur_us"])))
    if not todo:
        return []
    device = S.DEVICE
    total_s = sum(t[4] for t in todo.values()) / 1e6
    reps = max(1, min(7, int(deadline.left() * share / max(2 * total_s, 1e-6)) - 1))
    out = []
    for i, (call, shapes, strides, dtypes, _) in enumerate(todo.values()):
        if i and deadline.left() <= 0:
            reps = 1  # over budget: every GEMM still once
        ops = [_operand(s, st, d, device) for s, st, d in zip(shapes, strides, dtypes)]
        name = next(k for k, v in _GEMM_CALLS.items() if v is call)
        us = S.time_call(lambda call=call, ops=ops: call(*ops), reps)
        rec = S._gemm_record(name, ops, us, {"batch_size": batch})
        rec["sweep"] = "gemm"
        out.append(rec)
    return out


def _table_scales(total_bytes: float, llc: float) -> list[float]:
    """Fractions of the run's tables to draw, largest and smallest first: the run's own
    (capped at `MAX_TABLE_BYTES`), and where smaller, the last-level cache's size, 8x it and an
    eighth of it (an FAE or Hotline device tier of hot rows is that small); two at least."""
    top = min(total_bytes, MAX_TABLE_BYTES)
    sizes = sorted({top, *(b for b in (llc / 8, llc, 8 * llc) if b < top)}, reverse=True)
    if len(sizes) == 1:  # tables the cache holds: a sixteenth of them, as a small hot tier
        sizes.append(top / 16)
    order = [sizes[0], sizes[-1], *sizes[1:-1]]
    return [b / total_bytes for b in order]


def _embeddings(cfg, table_sizes, hw, device, deadline: Deadline) -> tuple[list[dict], int]:
    """The fused embedding lookup forward and backward (with the run's optimizer, dimension,
    batch and bags) over the run's tables scaled by `_table_scales`: (records, draws). Two draws
    at least (the largest and the smallest), more as time allows."""

    dim = int(cfg.arch.sparse_feature_size)
    opt = cfg.training.sparse_optimizer()
    batch = int(cfg.training.mini_batch_size)
    zipf = float(cfg.data.synthetic_zipf)
    bags = list(cfg.data.multi_hot_sizes or [1] * len(table_sizes))
    row_bytes = 4.0 * (dim + opt.state_floats(dim))
    total = float(sum(table_sizes)) * row_bytes
    out, draws = [], 0
    scales = _table_scales(total, float(hw["llc_bytes"]))
    for i, f in enumerate(scales):
        if i >= 2 and deadline.left() <= 0:
            break
        sizes = [max(2, int(round(n * f))) for n in table_sizes] if f < 1 else list(table_sizes)
        ctx = {"table_sizes": sizes, "embedding_dim": dim, "zipf": zipf,
               "optimizer": cfg.training.optimizer, "batch_size": batch}  # fmt: skip
        # the time left shared by the draws still to come
        share = max(deadline.left(), 0.0) / (len(scales) - i)
        out += _embedding_draw(ctx, opt, bags, device, share, seed=i)
        draws += 1
    return out, draws


def zipf_ids(rows: int, alpha: float, n: int, gen: torch.Generator) -> torch.Tensor:
    """`n` ids of a table of `rows` rows drawn from the bounded power law the synthetic data and
    the embedding model's hit rate assume (`kernel_models.hit_rate`: rank mass ~ r^(1-a)), ranks
    scattered over the table by a multiplicative hash (popular rows are not neighbours).
    Drawn by torch in milliseconds: the planted world's generator took seconds for the
    millions of ids of MLPerf's bags."""
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    om = 1.0 - alpha
    if abs(om) < 1e-4:
        rank = torch.exp(u * math.log(rows + 1.0))
    else:
        rank = (1.0 + u * ((rows + 1.0) ** om - 1.0)) ** (1.0 / om)
    rank = (rank.floor().to(torch.int64) - 1).clamp_(0, rows - 1)
    return (rank * 2654435761) % rows


def _embedding_draw(ctx: dict, opt, bags: list[int], device, seconds: float, seed: int):
    """One draw: the records of the lookup's forward and backward over tables of
    ``ctx["table_sizes"]`` rows, profiled as many times (1-5) as `seconds` allows."""
    from embeddings import FusedEmbeddingBagCollection, tables_for_features
    from perfmodel import sweeps as S

    sizes, batch = ctx["table_sizes"], ctx["batch_size"]
    emb = FusedEmbeddingBagCollection(
        tables_for_features(sizes, ctx["embedding_dim"]), opt, device=device
    )
    lengths = torch.tensor(bags, dtype=torch.int64)[:, None].expand(len(sizes), batch)
    per_batch = int(lengths.sum(1).max())
    # distinct batches, cycled: a step's ids are not those the last one cached (two for bags of
    # many ids: MLPerf's 214 ids a sample make the ids, not the rows, the cost of a draw)
    n_batches = 4 if len(sizes) * batch <= 1 << 17 else 2
    gen = torch.Generator().manual_seed(seed)
    keys = [f"cat_{t}" for t in range(len(sizes))]
    kjts = []
    for _ in range(n_batches):
        rows = torch.stack([zipf_ids(n, ctx["zipf"], per_batch, gen) for n in sizes])
        kjts.append(S.pooled_kjt(keys, rows, lengths).to(device))
    it = iter(range(1 << 30))

    def step() -> None:
        emb(kjts[next(it) % n_batches]).values().sum().backward()

    reps = 1
    if seconds > 0:  # over budget: one rep, not timed first (MLPerf's bags: seconds a step)
        t0 = time.perf_counter()
        step()
        _sync(device)
        reps = max(1, min(5, int(seconds / max(time.perf_counter() - t0, 1e-4)) - 1))
    out = S.profile_kernels(step, reps, ctx)
    for r in out:
        r["sweep"] = "embedding"
    return out
