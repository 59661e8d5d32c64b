"""`--perf-log DIR`: record a few training steps after warm-up and write their perf trace.

The recorder is the train pipeline's step hook (`dlrm.pipelines.base.StepHook`): `python -m
dlrm.train --perf-log DIR` attaches it (registered below, dlrm/pipelines/step_hooks.py); a library user passes `Trainer(cfg,
step_hook=StepRecorder(DIR))`. Without it the pipeline's default hook does nothing, so there is no
profiler object, label or hook on the hot path. The recorder times `warmup` plain steps, then
records `steps` steps under torch.profiler with labels, writes ``DIR/trace-rank<r>.trace.json``
(format in `perfmodel.trace`) and from then on only runs the steps.

Labels: the pipeline's phases (``perf::forward``, ``perf::backward``: the autograd nodes,
``perf::optimizer``) through the hook's `phase`, and ``perf::embedding_lookup`` through forward
hooks on the embedding collection, installed only while recording. Every label is entered and
left on the training thread.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from dlrm.pipelines import step_hooks
from dlrm.pipelines.base import StepHook
from perfmodel import trace as tr

log = logging.getLogger(__name__)


def label(name: str) -> record_function:
    return record_function(tr.LABEL_PREFIX + name)


class PhaseLabels(StepHook):
    """A step hook that labels the pipeline's phases; as a context manager, it also labels the
    embedding lookup (forward hooks on `model.embeddings`, removed on exit)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.handles: list = []
        self.open: list[record_function] = []

    def phase(self, name: str):
        return label(name)

    def __enter__(self) -> PhaseLabels:
        emb = getattr(self.model, "embeddings", None)
        if isinstance(emb, torch.nn.Module):
            self.handles.append(
                emb.register_forward_pre_hook(lambda *a: self._enter("embedding_lookup"))
            )
            self.handles.append(emb.register_forward_hook(lambda *a: self._exit()))
        return self

    def __exit__(self, *exc) -> None:
        while self.open:
            self._exit()
        for h in self.handles:
            h.remove()
        self.handles = []

    def _enter(self, name: str) -> None:
        rf = label(name)
        rf.__enter__()
        self.open.append(rf)

    def _exit(self) -> None:
        if self.open:
            self.open.pop().__exit__(None, None, None)


def activities() -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def _profile(steps: list[Callable[[], object]], labels: PhaseLabels, uses_cuda: bool) -> list[dict]:
    """Run each step under the profiler with the embedding-lookup labels; the step graphs."""
    clocks = []
    with labels, profile(activities=activities(), record_shapes=True) as prof:
        for run in steps:
            w0, c0 = time.perf_counter(), time.thread_time()
            with record_function(tr.STEP_LABEL):
                run()
                if uses_cuda:
                    torch.cuda.synchronize()
            clocks.append(((time.perf_counter() - w0) * 1e6, (time.thread_time() - c0) * 1e6))
    graphs = tr.graph_from_events(prof.events(), uses_cuda=uses_cuda)
    for g, (wall, cpu) in zip(graphs, clocks):
        g["wall_us"], g["cpu_us"] = wall, cpu  # cpu / wall < 1: the step was descheduled
    return graphs


def profile_steps(pipeline, batches: list, uses_cuda: bool) -> list[dict]:
    """One profiled, labelled step of `pipeline` (a `dlrm.pipelines.base.TrainPipeline`) per batch;
    the step graphs. The pipeline's own hook is put back afterwards."""
    labels = PhaseLabels(pipeline.model)
    saved, pipeline.hook = pipeline.hook, labels
    try:
        return _profile(
            [lambda b=b: pipeline.progress(iter([b])) for b in batches], labels, uses_cuda
        )
    finally:
        pipeline.hook = saved


def run_steps(pipeline, batches: list) -> None:
    """Plain (unprofiled) steps of `pipeline` on materialised batches."""
    for b in batches:
        pipeline.progress(iter([b]))


def trace_meta(trainer, batch_size: int) -> dict:
    """What a perf trace records about the run that made it (the kernel models' inputs)."""
    from perfmodel.hardware import profiler_event_cost_us

    cfg = trainer.cfg
    emb = trainer.model.embeddings
    return {
        "batch_size": int(batch_size),
        "precision": cfg.training.precision,
        "device": str(trainer.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "config": cfg.to_json(),
        "table_sizes": [int(t.num_embeddings) for t in emb.tables],
        "embedding_dim": int(cfg.arch.sparse_feature_size),
        "zipf": float(cfg.data.synthetic_zipf),
        "optimizer": cfg.training.optimizer,
        "placement": str(cfg.placing.placement),
        "profiler_event_cost_us": profiler_event_cost_us(),
        "dense_params": int(sum(p.numel() for p in trainer.model.dense_parameters())),
    }


class StepRecorder(StepHook):
    """The trainer's step hook while `--perf-log` is on."""

    def __init__(self, out_dir: str | Path, warmup: int = 5, steps: int = 5) -> None:
        self.out_dir = Path(out_dir)
        self.warmup, self.steps = warmup, steps
        self.trainer = None
        self._labels: PhaseLabels | None = None  # set while a step is recorded
        self._seen = 0
        self._pending: list = []
        self._plain_us: list[float] = []
        self._plain_cpu_us: list[float] = []
        self.done = False
        self.path: Path | None = None

    def attach(self, trainer) -> None:
        self.trainer = trainer

    def phase(self, name: str):
        return label(name) if self._labels is not None else nullcontext()

    def step(self, batch, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.done:
            return run()
        self._seen += 1
        if self._seen <= self.warmup:
            t0, c0 = time.perf_counter(), time.thread_time()
            loss = run()
            if self._seen > 2:  # the first steps pay one-off allocation and caching
                self._plain_us.append((time.perf_counter() - t0) * 1e6)
                self._plain_cpu_us.append((time.thread_time() - c0) * 1e6)
            return loss
        losses: list[torch.Tensor] = []
        self._labels = PhaseLabels(self.trainer.model)
        try:
            uses_cuda = self.trainer.device.type == "cuda"
            self._pending.extend(_profile([lambda: losses.append(run())], self._labels, uses_cuda))
        finally:
            self._labels = None
        if len(self._pending) >= self.steps:
            self._write(batch.labels.numel())
        return losses[0]

    def _write(self, batch_size: int) -> None:
        meta = trace_meta(self.trainer, batch_size)
        meta["unprofiled_step_us"] = statistics.median(self._plain_us) if self._plain_us else None
        meta["unprofiled_step_cpu_us"] = (
            statistics.median(self._plain_cpu_us) if self._plain_cpu_us else None
        )
        self.path = self.out_dir / f"trace-rank{self.trainer.rank}.trace.json"
        tr.write_trace(tr.make_doc(meta, self._pending), self.path)
        log.info("perf trace of %d steps written to %s", len(self._pending), self.path)
        self._pending = []
        self.done = True


# `python -m dlrm.train --perf-log DIR` finds the recorder here: dlrm imports this module as a
# plugin (the `hybrid_dlrm.plugins` entry point, pyproject.toml) and never names perfmodel itself.
step_hooks.register("perf_log", StepRecorder)

# the placement planner's predictor (dlrm/placement/candidates.py) comes with the same plugin import
import perfmodel.placement_costs  # noqa: E402, F401
