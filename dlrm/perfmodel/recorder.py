"""`--perf-log DIR`: record a few training steps after warm-up and write their perf trace.

The trainer picks its step function once: `Trainer.train_step` when perf logging is off (no
profiler object, no labels, no hooks on the hot path), `StepRecorder.step` when it is on. The
recorder times `warmup` plain steps, then records `steps` steps under torch.profiler with
labels, writes ``DIR/trace-rank<r>.trace.json`` (format in `dlrm.perfmodel.trace`) and from then
on only forwards to `train_step`.

Labels come from hooks installed only while recording: model forward pre/post hooks
(``perf::forward``), the embedding collection's (``perf::embedding_lookup``), the model's
forward-end to the dense optimizer's step pre-hook (``perf::backward``: loss, zero_grad and the
autograd nodes) and the step pre/post hooks (``perf::optimizer``). Every label is entered and
left on the training thread.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from dlrm.perfmodel import trace as tr

log = logging.getLogger(__name__)


class _Labels:
    """record_function labels around the forward pass, the embedding lookup, backward and the
    optimizer step, installed only while recording and removed afterwards."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.open: dict[str, record_function] = {}
        self.handles = []
        emb = getattr(model, "embeddings", None)
        self.handles.append(model.register_forward_pre_hook(lambda *a: self._enter("forward")))
        self.handles.append(model.register_forward_hook(lambda *a: self._exit("forward")))
        if isinstance(emb, torch.nn.Module):
            self.handles.append(
                emb.register_forward_pre_hook(lambda *a: self._enter("embedding_lookup"))
            )
            self.handles.append(
                emb.register_forward_hook(lambda *a: self._exit("embedding_lookup"))
            )
        # Backward and the optimizer step are wrapped, not hooked, so that their labels nest
        # properly around torch's own (autograd nodes, Optimizer.step#...).
        self.optimizer = optimizer
        self._orig_backward = torch.Tensor.backward
        torch.Tensor.backward = _labelled(self._orig_backward, "backward")
        optimizer.step = _labelled(optimizer.step, "optimizer")

    def _enter(self, name: str) -> None:
        rf = record_function(tr.LABEL_PREFIX + name)
        rf.__enter__()
        self.open[name] = rf

    def _exit(self, name: str) -> None:
        rf = self.open.pop(name, None)
        if rf is not None:
            rf.__exit__(None, None, None)

    def close(self) -> None:
        for name in list(self.open):
            self._exit(name)
        for h in self.handles:
            h.remove()
        torch.Tensor.backward = self._orig_backward
        del self.optimizer.step  # back to the class's method


def _labelled(fn, name: str):
    def wrapper(*args, **kwargs):
        with record_function(tr.LABEL_PREFIX + name):
            return fn(*args, **kwargs)

    return wrapper


def activities() -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


def profile_steps(step_fn, batches, model, optimizer, uses_cuda: bool) -> list[dict]:
    """Run step_fn on each batch under the profiler with phase labels; return the step graphs."""
    labels = _Labels(model, optimizer)
    clocks = []
    try:
        with profile(activities=activities(), record_shapes=True) as prof:
            for batch in batches:
                w0, c0 = time.perf_counter(), time.thread_time()
                with record_function(tr.STEP_LABEL):
                    step_fn(batch)
                    if uses_cuda:
                        torch.cuda.synchronize()
                clocks.append(((time.perf_counter() - w0) * 1e6, (time.thread_time() - c0) * 1e6))
    finally:
        labels.close()
    graphs = tr.graph_from_events(prof.events(), uses_cuda=uses_cuda)
    for g, (wall, cpu) in zip(graphs, clocks):
        g["wall_us"], g["cpu_us"] = wall, cpu  # cpu / wall < 1: the step was descheduled
    return graphs


def trace_meta(trainer, batch_size: int) -> dict:
    """What a perf trace records about the run that made it (the kernel models' inputs)."""
    from dlrm.perfmodel.hardware import profiler_event_cost_us

    cfg = trainer.cfg
    emb = trainer.model.embeddings
    return {
        "batch_size": int(batch_size),
        "precision": cfg.precision,
        "device": str(trainer.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "config": cfg.to_json(),
        "table_sizes": [int(t.num_embeddings) for t in emb.tables],
        "embedding_dim": int(cfg.arch_sparse_feature_size),
        "zipf": float(cfg.synthetic_zipf),
        "optimizer": cfg.optimizer,
        "placement": str(cfg.placement),
        "profiler_event_cost_us": profiler_event_cost_us(),
        "dense_params": int(sum(p.numel() for p in trainer.model.dense_parameters())),
    }


class StepRecorder:
    """The trainer's step function while `--perf-log` is on."""

    def __init__(self, trainer, out_dir: str | Path, warmup: int = 5, steps: int = 5) -> None:
        self.trainer = trainer
        self.out_dir = Path(out_dir)
        self.warmup, self.steps = warmup, steps
        self._seen = 0
        self._pending: list = []
        self._plain_us: list[float] = []
        self._plain_cpu_us: list[float] = []
        self.done = False
        self.path: Path | None = None

    def step(self, batch) -> torch.Tensor:
        if self.done:
            return self.trainer.train_step(batch)
        self._seen += 1
        if self._seen <= self.warmup:
            t0, c0 = time.perf_counter(), time.thread_time()
            loss = self.trainer.train_step(batch)
            if self._seen > 2:  # the first steps pay one-off allocation and caching
                self._plain_us.append((time.perf_counter() - t0) * 1e6)
                self._plain_cpu_us.append((time.thread_time() - c0) * 1e6)
            return loss
        losses: list[torch.Tensor] = []
        uses_cuda = self.trainer.device.type == "cuda"
        graphs = profile_steps(lambda b: losses.append(self.trainer.train_step(b)), [batch],
                               self.trainer.model, self.trainer.dense_optimizer, uses_cuda)  # fmt: skip
        self._pending.extend(graphs)
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
