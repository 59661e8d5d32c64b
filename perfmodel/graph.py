"""The execution graph of a configuration's training step, without training it.

The graph is captured, not hand-written, so it is exactly what the trainer runs (autocast
casts, autograd nodes, the fused embedding ops, whatever a placement adds): the model is built
from the configuration and one step is profiled at two small batch sizes (B1, B2). Each shape
dimension is then linear in the batch size, d(B) = d(B1) + (d(B2) - d(B1)) * (B - B1) / (B2 - B1)
(constant dims stay constant), which gives the graph at any batch size. With FAE placement
the hot and the cold mini-batches run different operators: both are captured, and the
prediction weights them by the share of hot inputs. The capture takes a few
hundred milliseconds and is cached per configuration (in memory and under the cache directory).

Kernel records carry ``ctx``: the context the kernel models need beyond shapes (table sizes,
embedding dimension, Zipf exponent, optimizer, batch size).
"""

from __future__ import annotations

import atexit
import copy
import functools
import hashlib
import itertools
import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from dlrm.config import TrainConfig
from dlrm.pipelines.fae_batches import FAEBatchSource
from embeddings.hot_inputs import AllHotClassifier
from perfmodel.features import on_device, step_dense_bytes

log = logging.getLogger(__name__)

B1, B2 = 16, 24
SCALED_FIELDS = ("shapes", "strides", "out_shape")
CTX_FIELDS = (
    "table_sizes",
    "embedding_dim",
    "zipf",
    "optimizer",
    "batch_size",
    "precision",
    "placement",
    "dense_params",
)
_MEMO: dict[str, dict] = {}


@functools.cache
def _scratch_root() -> Path:
    """One scratch directory per process for the trainers built here, removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="perfmodel-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def scratch_dir(prefix: str) -> Path:
    """A fresh directory under the process's scratch root (run directories, placement plans:
    an FAE trainer writes its access profile there, tens of MB)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_scratch_root()))


def build_trainer(cfg: TrainConfig):
    """A Trainer for measuring and capturing (never writes its run directory unless fit). Its
    step is eager: the kernel models are of the eager step's operators (`--compile` off)."""
    from dlrm.trainer import Trainer  # here: `python -m perfmodel --help` need not load torchrec

    tmp = str(scratch_dir("run-"))
    cfg = cfg.replace(out_dir=tmp, perf_log=None, resume=None, progress=False, compile=False)
    return Trainer(cfg, checkpoints=False)


def batches_for(trainer, batch_size: int, n: int, start: int = 0) -> list:
    """n batches of the trainer's training data at any batch size, materialised up front."""
    from data_pipeline.synthetic import SyntheticBatchSource

    src = trainer.data.train
    if hasattr(src, "world"):  # synthetic: the same stream at this batch size, as long as needed
        src = SyntheticBatchSource(src.world, "train", batch_size, n + start)
    it = src.batches(0, start=start)
    return [next(it).to(trainer.device) for _ in range(n)]


def capture_ops(
    trainer, batch_size: int, warmup: int = 2, steps: int = 1
) -> tuple[list[dict], dict]:
    from perfmodel.profiling import profile_steps, run_steps, trace_meta

    bs = batches_for(trainer, batch_size, warmup + steps)
    run_steps(trainer.pipeline, bs[:warmup])
    graphs = profile_steps(trainer.pipeline, bs[warmup:], trainer.device.type == "cuda")
    return graphs[-1]["ops"], trace_meta(trainer, batch_size)


def _signature(ops: list[dict]) -> list:
    return [(o["name"], [k["name"] for k in o["kernels"]]) for o in ops]


def _scale(a, b, batch: int):
    if isinstance(a, list):
        return [_scale(x, y, batch) for x, y in zip(a, b)]
    if isinstance(a, int) and isinstance(b, int) and a != b:
        return max(int(round(a + (b - a) * (batch - B1) / (B2 - B1))), 0)
    return a


def instantiate(template: dict, batch_size: int) -> list[dict]:
    """The captured graph at `batch_size`: ops with shapes extrapolated and kernel ctx set, each
    kernel with its context in its op (`kernel_contexts`), as the fit traces' records have it:
    the in-situ factors are keyed by it (`KernelModels.situ_keys`)."""
    ops1, ops2 = template["ops"][0], template["ops"][1]
    meta = dict(template["meta"], batch_size=int(batch_size))
    ctx = {k: meta.get(k) for k in CTX_FIELDS}
    out = []
    for o1, o2 in zip(ops1, ops2):
        op = copy.deepcopy(o1)
        for f in SCALED_FIELDS:
            if f in o1:
                op[f] = _scale(o1[f], o2.get(f, o1[f]), batch_size)
        for k, (k1, k2) in enumerate(zip(o1["kernels"], o2["kernels"])):
            for f in SCALED_FIELDS:
                if f in k1:
                    op["kernels"][k][f] = _scale(k1[f], k2.get(f, k1[f]), batch_size)
            op["kernels"][k]["ctx"] = ctx
        for k, where in zip(op["kernels"], kernel_contexts(op)):
            k["op"] = where
        out.append(op)
    return out


def graph_key(cfg: TrainConfig) -> str:
    data = cfg.to_json()
    # what a step's operators do not depend on; a profile file is of the data the key names
    # (its settings and sample rate are in it): the planner's own, in each run's directory,
    # would otherwise make every run capture FAE's step again
    for f in ("mini_batch_size", "out_dir", "perf_log", "progress", "num_batches", "data_size",
              "test_data_size", "print_freq", "test_freq", "resume", "save_model",
              "keep_checkpoints", "profile_file"):  # fmt: skip
        data.pop(f, None)
    data["_threads"] = torch.get_num_threads()
    data["_code"] = _step_code_fingerprint()
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _step_code_fingerprint() -> str:
    """A hash of the source that decides which operators a training step runs (models,
    embeddings, trainer): a cached graph captured before that code changed is not reused."""
    import dlrm
    import embeddings

    roots = [Path(dlrm.__file__).parent / "models", Path(embeddings.__file__).parent]
    files = sorted(f for r in roots for f in r.rglob("*.py"))
    files += [Path(dlrm.__file__).parent / f for f in ("trainer.py", "pipelines/base.py")]
    h = hashlib.sha1()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def is_fae(trainer) -> bool:
    """Does the trainer run FAE's schedule of hot and cold mini-batches?"""
    return isinstance(trainer.data.train, FAEBatchSource)


def capture_variants(trainer, batch_size: int, max_steps: int = 64) -> dict[str, list[dict]]:
    """{"step": ops}, or with FAE {"hot": ops, "cold": ops}: the two kinds of mini-batch the
    scheduler makes run different operators (the device-tier lookup vs the host one)."""
    if not is_fae(trainer):
        return {"step": capture_ops(trainer, batch_size)[0]}
    from perfmodel.profiling import profile_steps, run_steps

    all_hot = AllHotClassifier(trainer.placement.plan)
    found: dict[str, list[dict]] = {}
    seen: dict[str, int] = {}
    # an epoch shorter than max_steps, or one kind only (every input hot, or none): what it has
    for batch in itertools.islice(trainer.data.train.batches(0), max_steps):
        batch = batch.to(trainer.device)
        kind = "hot" if bool(all_hot(batch.sparse_features).all()) else "cold"
        seen[kind] = seen.get(kind, 0) + 1
        if kind in found or seen[kind] <= 2:  # warm each kind up first
            run_steps(trainer.pipeline, [batch])
            continue
        found[kind] = profile_steps(trainer.pipeline, [batch], trainer.device.type == "cuda")[-1][
            "ops"
        ]
        if len(found) == 2:
            break
    return found


def hot_share(trainer, n_batches: int = 8) -> float:
    """FAE: the share of training inputs whose lookups are all hot (= the share of hot batches
    the scheduler makes); 0 without FAE."""
    if not is_fae(trainer):
        return 0.0
    all_hot = AllHotClassifier(trainer.placement.plan)
    src = getattr(trainer.data.train, "source", trainer.data.train)
    masks = [all_hot(src.batch(0, i).sparse_features) for i in range(n_batches)]
    return float(torch.cat(masks).float().mean())


def capture_template(cfg: TrainConfig) -> dict:
    """Capture the step at B1 and B2 (cached by configuration)."""
    key = graph_key(cfg)
    if key in _MEMO:
        return _MEMO[key]
    from perfmodel.hardware import cache_dir

    path = cache_dir() / "graphs" / f"{key}.json"
    if path.exists():
        try:
            template = json.loads(path.read_text())
            _MEMO[key] = template
            return template
        except json.JSONDecodeError:
            pass
    threads = torch.get_num_threads()
    plan = {}
    if cfg.to_json().get("placement") in ("fae", "auto") and not cfg.to_json().get(
        "placement_plan"
    ):
        # both captures must train with the same placement: the first writes the plan
        plan = {"placement_plan": str(scratch_dir("plan-") / "plan")}
    variants = []
    meta: dict = {}
    share = 0.0
    for b in (B1, B2):
        trainer = build_trainer(cfg.replace(mini_batch_size=b, **plan))
        variants.append(capture_variants(trainer, b))
        if b == B1:
            from perfmodel.profiling import trace_meta

            meta = trace_meta(trainer, b)
            share = hot_share(trainer)
    torch.set_num_threads(threads)  # numba's OpenMP layer may have changed it
    kinds = sorted(set(variants[0]) & set(variants[1]))
    if not kinds:
        raise RuntimeError("could not capture the same kinds of step at two batch sizes")
    for kind in kinds:
        if _signature(variants[0][kind]) != _signature(variants[1][kind]):
            raise RuntimeError(f"the {kind} step's operators differ between two batch sizes")
    meta.pop("batch_size", None)
    weights = {"step": 1.0} if kinds == ["step"] else {"hot": share, "cold": 1.0 - share}
    if "hot" not in kinds or "cold" not in kinds:
        weights = {k: 1.0 / len(kinds) for k in kinds}
    meta["hot_share"] = share
    template = {"key": key, "batch_sizes": [B1, B2], "meta": meta, "weights": weights,
                "variants": {k: [variants[0][k], variants[1][k]] for k in kinds}}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(template))
    _MEMO[key] = template
    return template


def graph_for(
    cfg: TrainConfig, batch_size: int | None = None
) -> tuple[dict[str, tuple[float, list[dict]]], dict]:
    """({kind: (weight, ops)}, meta) of the configuration's training step at `batch_size`
    (default: the config's). One kind ("step") except with FAE ("hot" and "cold", weighted by
    the share of hot mini-batches)."""
    batch = int(batch_size or cfg.training.mini_batch_size)
    template = capture_template(cfg)
    meta = dict(template["meta"], batch_size=batch)
    out = {}
    for kind, pair in template["variants"].items():
        out[kind] = (template["weights"][kind], instantiate({"meta": meta, "ops": pair}, batch))
    return out, meta


def records_from_trace(doc: dict) -> list[dict]:
    """Kernel records (kernel + ctx) of a trace, for fitting and for kernel-error reports: one
    per kernel position of the step, its time estimated over the trace's steps as in
    `sweeps.kernel_estimate` (steps whose operators differ are taken one by one)."""
    from perfmodel.sweeps import kernel_estimate

    meta = doc["meta"]
    ctx = {k: meta.get(k) for k in CTX_FIELDS}
    cost = meta.get("profiler_event_cost_us", 0.0)
    groups: dict[str, list[dict]] = {}
    for step in doc["steps"]:
        groups.setdefault(json.dumps(_signature(step["ops"])), []).append(step)
    out = []
    for steps in groups.values():
        ratios = [min(s.get("cpu_us", 1.0) / max(s.get("wall_us", 1.0), 1e-9), 1.0) for s in steps]
        kernels = [[k for op in s["ops"] for k in op["kernels"]] for s in steps]
        parents = [c for op in steps[0]["ops"] for c in kernel_contexts(op)]
        step_bytes = step_dense_bytes(kernels[0])
        for i, k in enumerate(kernels[0]):
            # device kernels' durations are the device's: the host's descheduling is not in them
            dur = kernel_estimate(
                [ks[i]["dur_us"] for ks in kernels], [1.0] * len(ratios) if on_device(k) else ratios
            )
            out.append(dict(k, dur_us=dur, ctx=ctx, event_cost_us=cost, op=parents[i],
                            step_bytes=step_bytes))  # fmt: skip
    return out


def kernel_contexts(op: dict) -> list[str]:
    """Where each kernel of a top-level op runs: the op's name and the kernel's rank among the
    op's kernels of the same name (the first and second `sub_` of a loss see different caches)."""
    seen: dict[str, int] = {}
    out = []
    for k in op["kernels"]:
        n = seen.get(k["name"], 0)
        seen[k["name"]] = n + 1
        out.append(f"{op['name']}#{n}")
    return out


def ops_with_ctx(doc: dict, step: int) -> list[dict]:
    """A traced step's ops with the trace's context (and its op's name) on every kernel (for the
    traversal)."""
    ctx = {k: doc["meta"].get(k) for k in CTX_FIELDS}
    ops = copy.deepcopy(doc["steps"][step]["ops"])
    for op in ops:
        for k, c in zip(op["kernels"], kernel_contexts(op)):
            k["ctx"] = ctx
            k["op"] = c
    return ops


def least_disturbed_step(doc: dict) -> int:
    """The step with the highest thread-CPU / wall ratio."""
    steps = doc["steps"]
    return max(
        range(len(steps)),
        key=lambda i: steps[i].get("cpu_us", 1.0) / max(steps[i].get("wall_us", 1.0), 1e-9),
    )


def corrected_us(rec: dict) -> float:
    """A traced kernel's duration less the profiler events nested inside it (host kernels: the
    profiler's events cost host time, not device time)."""
    cost = float(rec.get("event_cost_us") or 0.0)
    d = float(rec["dur_us"])
    if on_device(rec):
        return d
    return max(d - cost * max(int(rec.get("n_events", 1)) - 1, 0), 0.5 * d)
