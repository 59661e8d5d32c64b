"""The training step as an object, in torchrec's style: `progress(batches)` takes the next batch
from an iterator and runs one optimisation step on it.

Variants of the step (Hotline's popular/non-popular split, Slipstream's skipping) are subclasses
of `TrainPipeline`, not branches in the trainer's loop. The trainer owns what is around the step
(learning-rate policy, logging, evaluation, checkpoints); a pipeline owns the step itself.

`StepHook` is how tools watch steps without patching torch: the performance model's recorder
wraps whole steps (`step`) and labels their phases (`phase`: "forward", "backward", "optimizer").
"""

from __future__ import annotations

import functools
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchrec.datasets.utils import Batch

from dlrm.errors import NonFiniteLoss


@dataclass
class StepResult:
    loss: torch.Tensor  # detached, on the training device
    samples: int
    data_s: float  # waiting for the batch and moving it to the device
    compute_s: float  # forward, backward (with the fused sparse updates), optimizer
    kind: str | None = None  # the embedding collection's step kind (FAE: "hot" or "cold")
    source_batches: int = 1  # the data's batches this step consumed (Slipstream's drop: 0 or more)


class StepHook:
    """Does nothing: the default. Subclasses observe steps (see the module docstring)."""

    def attach(self, trainer) -> None:
        """Called once by the Trainer that runs the steps (what a hook may want to describe)."""

    def step(self, batch: Batch, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Runs the step on `batch` by calling `run()`; returns what it returned (the loss)."""
        return run()

    def phase(self, name: str) -> AbstractContextManager:
        return nullcontext()


class StepHooks(StepHook):
    """Several hooks on the same steps (the thread watch and `--perf-log`'s recorder): each
    step runs inside every hook's `step`, the first outermost; phases open in the same order."""

    def __init__(self, hooks: list) -> None:
        self.hooks = hooks

    @staticmethod
    def of(*hooks) -> StepHook | None:
        """The hooks given (None: absent) as one hook: None, the only one, or all of them."""
        present = [h for h in hooks if h is not None]
        return None if not present else present[0] if len(present) == 1 else StepHooks(present)

    def attach(self, trainer) -> None:
        for h in self.hooks:
            h.attach(trainer)

    def step(self, batch: Batch, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        for h in reversed(self.hooks):
            run = functools.partial(h.step, batch, run)
        return run()

    @contextmanager
    def phase(self, name: str):
        with ExitStack() as stack:
            for h in self.hooks:
                stack.enter_context(h.phase(name))
            yield


class TrainPipeline(ABC):
    hook: StepHook

    @abstractmethod
    def progress(self, batches: Iterator[Batch]) -> StepResult:
        """One optimisation step on the next batch of `batches` (StopIteration when there is none)."""

    def state_dict(self) -> dict:
        """What a checkpoint must hold of the pipeline itself for an exact resume (Slipstream's)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()` (an empty dict: start afresh)."""
        return None

    def counters(self) -> dict:
        """The pipeline's own counters for metrics.jsonl and summary.json (Slipstream's)."""
        return {}

    def summary_parts(self) -> dict[str, dict]:
        """summary.json's parts of the capabilities this pipeline adds (`{"slipstream": {...}}`);
        none by default."""
        return {}


def loss_of(
    logits: torch.Tensor, labels: torch.Tensor, kind: str, batch_size: int | None = None
) -> torch.Tensor:
    """The mean loss; with `batch_size`, the sum over these inputs divided by it (a part of a
    mini-batch: every input's gradient is scaled by exactly 1 / batch_size, as in the mean over
    the whole mini-batch)."""
    logits = logits.float()
    reduction = "mean" if batch_size is None else "sum"
    if kind == "mse":
        loss = F.mse_loss(torch.sigmoid(logits), labels, reduction=reduction)
    else:
        loss = F.binary_cross_entropy_with_logits(logits, labels, reduction=reduction)
    return loss if batch_size is None else loss / batch_size


class PlainTrainPipeline(TrainPipeline):
    """Forward (the dense part under bf16 autocast when asked; embeddings stay fp32), the loss,
    backward (which applies the fused sparse updates inside the embedding collection), then the
    dense optimizer's step."""

    def __init__(
        self,
        model: torch.nn.Module,
        dense_optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str = "fp32",
        loss_function: str = "bce",
        hook: StepHook | None = None,
        forward: torch.nn.Module | None = None,
        written=None,
    ) -> None:
        """`forward`: the module a step calls instead of `model` (the model under DDP).
        `written`: `--compile`'s written-out dense step (dlrm/pipelines/compile.py's CompiledDenseForward,
        `writes_steps()` and `train_step(...)`), which steps then run while it compiles."""
        self.model = model
        self.forward = forward if forward is not None else model
        self.dense_optimizer = dense_optimizer
        self.device = device
        self.bf16 = precision == "bf16"
        self.loss_function = loss_function
        self.hook = hook or StepHook()
        self.written = written

    def progress(self, batches: Iterator[Batch]) -> StepResult:
        t0 = time.perf_counter()
        batch = next(batches).to(self.device, non_blocking=True)
        t1 = time.perf_counter()
        loss = self.hook.step(batch, lambda: self.step(batch))
        t2 = time.perf_counter()
        kind = self.model.embeddings.last_step_kind()
        return StepResult(loss, batch.labels.numel(), t1 - t0, t2 - t1, kind)

    def step(self, batch: Batch) -> torch.Tensor:
        """One optimisation step on a batch already on the device; returns the detached loss."""
        if self.written is not None and self.written.writes_steps():
            return self._written_step(batch)
        return self._autograd_step(batch)

    def _autograd_step(self, batch: Batch, pooled: torch.Tensor | None = None) -> torch.Tensor:
        """`pooled`: the batch's embedding lookup, already made (then only the dense part runs)."""
        hook = self.hook
        with (
            hook.phase("forward"),
            torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16),
        ):
            if pooled is None:
                logits = self.forward(batch.dense_features, batch.sparse_features)
            else:
                logits = self.model.dense_forward(batch.dense_features, pooled)
        loss = loss_of(logits, batch.labels, self.loss_function)
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(value)
        self.dense_optimizer.zero_grad(set_to_none=True)
        with hook.phase("backward"):
            loss.backward()  # also applies the fused sparse updates
        with hook.phase("optimizer"):
            self.dense_optimizer.step()
        return loss.detach()

    def _written_step(self, batch: Batch) -> torch.Tensor:
        """The step with the dense part's forward, loss and backward as one compiled call
        (dlrm/pipelines/dense_step.py) between the embedding lookup and its backward."""
        hook = self.hook
        with hook.phase("forward"):
            pooled = self.model.embeddings(batch.sparse_features).values()
            out = self.written.train_step(
                batch.dense_features, pooled.detach(), batch.labels, self.dense_optimizer
            )
        if out is None:  # it could not compile: this step and the next ones through autograd
            return self._autograd_step(batch, pooled)
        loss, grad_pooled, grads = out
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(value)
        for p, g in grads:
            p.grad = g
        with hook.phase("backward"):
            pooled.backward(grad_pooled)  # applies the fused sparse updates
        if grads:  # else plain SGD, which the written-out step applied itself
            with hook.phase("optimizer"):
                self.dense_optimizer.step()
        return loss
