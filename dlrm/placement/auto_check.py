"""Measured against predicted: the step time `--placement auto`'s choice was predicted to take,
next to what its first MEASURE_STEPS steps took (or every step of a shorter run).

A step hook (dlrm/pipelines/base.py's StepHook), composed around any other (`--perf-log`'s
recorder), so the trainer stays the loop. The measured time of a step is the wall time from its
start to the next step's start (the data wait, staging and write-back the step did not hide,
included, as the prediction counts them); the median leaves evaluation and checkpoint pauses out.
One line is printed and one `placement_check` event goes to metrics.jsonl, once per run: a
resumed run whose metrics.jsonl holds the check (made before its checkpoint) does not check again.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

from dlrm.pipelines.base import StepHook

log = logging.getLogger(__name__)

MEASURE_STEPS = 200
EVENT = "placement_check"


class MeasuredAgainstPredicted(StepHook):
    def __init__(
        self,
        label: str,
        predicted_ms: float | None,
        inner: StepHook | None = None,
        steps: int = MEASURE_STEPS,
    ) -> None:
        self.label, self.predicted_ms, self.steps = label, predicted_ms, steps
        self.inner = inner or StepHook()
        self.trainer = None
        self.intervals: list[float] = []
        self.durations: list[float] = []
        self._last: float | None = None
        self._target: int | None = None
        self.done = False
        self.result: dict | None = None

    def attach(self, trainer) -> None:
        self.inner.attach(trainer)
        self.trainer = trainer

    def phase(self, name: str):
        return self.inner.phase(name)

    def _steps_wanted(self) -> int:
        t = self.trainer
        if t is None:
            return self.steps
        left = t.steps_per_epoch() * t.cfg.training.nepochs - t.state.step
        return max(1, min(self.steps, left))

    def step(self, batch, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.done:
            return self.inner.step(batch, run)
        if self._target is None:
            if self.trainer is not None and self.trainer.files.logged(EVENT):
                # a resumed run whose check was made before its checkpoint: made once per run
                self.done = True
                return self.inner.step(batch, run)
            self._target = self._steps_wanted()
        t0 = time.perf_counter()
        if self._last is not None:
            self.intervals.append(t0 - self._last)
        self._last = t0
        loss = self.inner.step(batch, run)
        self.durations.append(time.perf_counter() - t0)
        if len(self.durations) >= self._target:
            self._report()
        return loss

    def _report(self) -> None:
        self.done = True
        measured = statistics.median(self.intervals or self.durations) * 1e3
        p = self.predicted_ms
        error = (measured - p) / p if p else None
        self.result = {
            "placement": self.label, "predicted_ms": p, "measured_ms": round(measured, 4),
            "measured_compute_ms": round(statistics.median(self.durations) * 1e3, 4),
            "steps_measured": len(self.durations), "relative_error": error,
        }  # fmt: skip
        against = f"against {p:.2f} ms predicted ({error:+.1%})" if p else "(no prediction)"
        line = (
            f"placement {self.label}: measured {measured:.2f} ms/step (median of "
            f"{len(self.durations)} steps) {against}"
        )
        t = self.trainer
        if t is not None:
            st = t.state
            t.files.event({"event": EVENT, "step": st.step + 1, "epoch": st.epoch,
                           **self.result})  # fmt: skip
            if t.rank == 0:
                print(line, flush=True)
        log.info(line)
