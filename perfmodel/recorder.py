"""`--perf-log DIR`: record a few training steps after warm-up and write their perf trace.

The recorder is the train pipeline's step hook (`dlrm.pipelines.base.StepHook`): `python -m
dlrm.train --perf-log DIR` attaches it (registered below, dlrm/pipelines/step_hooks.py); a library user passes `Trainer(cfg,
step_hook=StepRecorder(DIR))`. Without it the pipeline's default hook does nothing, so there is no
profiler object, label or hook on the hot path. The recorder times `warmup` plain steps, then
records `steps` steps under torch.profiler with labels, writes ``DIR/trace-rank<r>.trace.json``
(format in `perfmodel.trace`) and from then on only runs the steps.

The labels and the step graphs: perfmodel/profiling.py.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from dlrm.pipelines import step_hooks
from dlrm.pipelines.base import StepHook
from perfmodel import trace as tr
from perfmodel.profiling import PhaseLabels, label, profile_runs, trace_meta

log = logging.getLogger(__name__)


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
            self._pending.extend(
                profile_runs([lambda: losses.append(run())], self._labels, uses_cuda)
            )
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

# the placement planner's step costs (dlrm/placement/candidates.py's `default_costs` reads this
# name when a plan starts; nothing is registered by importing this module)
PLACEMENT_COSTS = "perfmodel.placement_costs:PlacementCosts"
