"""Training steps under torch.profiler, labelled, turned into step graphs (format in
`perfmodel.trace`): what the `--perf-log` recorder (recorder.py), the fit traces and the graph
capture (graph.py) all record, and what a trace says about the run that made it.

Labels: the pipeline's phases (``perf::forward``, ``perf::backward``: the autograd nodes,
``perf::optimizer``) through the hook's `phase`, and ``perf::embedding_lookup`` through forward
hooks on the embedding collection, installed only while recording. Every label is entered and
left on the training thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from dlrm.pipelines.base import StepHook
from perfmodel import trace as tr


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


def profile_runs(
    steps: list[Callable[[], object]], labels: PhaseLabels, uses_cuda: bool
) -> list[dict]:
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
        return profile_runs(
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
