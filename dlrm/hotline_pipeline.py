"""Hotline's train pipeline: each mini-batch split into popular and non-popular inputs, the cold
rows of the next mini-batches gathered on a worker while the current one computes.

Per mini-batch (embeddings/hotline.py holds the rows):
1. a worker classifies its inputs (popular: every lookup, history steps included for TBSM, is a
   device row), splits it into a popular and a non-popular micro-batch, and stages the
   non-popular one's unique cold rows on the device; it does so `prefetch` mini-batches ahead;
2. the step runs the popular micro-batch at once, then waits for the staged rows (the time it
   waits is `exposed_gather_s`), refreshes any staged row an earlier step has written back since
   its gather began, and runs the non-popular micro-batch;
3. one optimizer step: each micro-batch's loss is weighted by its share of the mini-batch, the
   dense gradients of both backward passes accumulate, and the sparse updates (device rows on
   the device, cold rows' gradients back to the host's optimizer) are applied once after both.
Fed the same mini-batches it computes what `--placement device` computes.

With `learn_batches`, the first mini-batches train with every row on the host while the
collection counts accesses; then a plan is made under the hot budget (`make_plan`) and the hot
rows move to the device.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torchrec.datasets.utils import Batch

from dlrm.errors import NonFiniteLoss
from dlrm.train_pipeline import PlainTrainPipeline, StepHook, StepResult, loss_of
from embeddings.hotline import HotlineEmbeddingBagCollection, StagedRows
from embeddings.kjt_ops import KJTSelector


@dataclass
class Split:
    """A mini-batch's popular and non-popular micro-batches (None when empty)."""

    inputs: int
    popular: Batch | None
    nonpopular: Batch | None
    popular_inputs: int
    cold_ids: torch.Tensor


def split_batch(
    batch: Batch, popular_steps: torch.Tensor
) -> tuple[Batch | None, Batch | None, int]:
    """(popular part, non-popular part, popular inputs). An input is its label's KJT rows (one
    for DLRM; ts_length + 1 consecutive rows for TBSM) and is popular when all of them are."""
    inputs = batch.labels.numel()
    per_input = popular_steps.numel() // inputs
    popular = popular_steps.view(inputs, per_input).all(1)
    kjt = KJTSelector(batch.sparse_features)
    parts = []
    for mask in (popular, ~popular):
        idx = torch.nonzero(mask).squeeze(1)
        if idx.numel() == 0:
            parts.append(None)
            continue
        steps = (idx.unsqueeze(1) * per_input + torch.arange(per_input)).reshape(-1)
        parts.append(
            Batch(
                dense_features=batch.dense_features[steps.to(batch.dense_features.device)],
                sparse_features=kjt.select(steps),
                labels=batch.labels[idx.to(batch.labels.device)],
            )
        )
    return parts[0], parts[1], int(popular.sum())


@dataclass
class _Pending:
    batch: Batch
    version: int
    split: Future = field(default_factory=Future)
    staged: Future = field(default_factory=Future)


class HotlineTrainPipeline(PlainTrainPipeline):
    def __init__(
        self,
        model: torch.nn.Module,
        dense_optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str = "fp32",
        loss_function: str = "bce",
        hook: StepHook | None = None,
        prefetch: int = 2,
        learn_batches: int = 0,
        make_plan: Callable[[HotlineEmbeddingBagCollection], object] | None = None,
    ) -> None:
        super().__init__(model, dense_optimizer, device, precision, loss_function, hook)
        self.coll: HotlineEmbeddingBagCollection = model.embeddings
        self.prefetch = prefetch
        self.learn_batches = learn_batches
        self.make_plan = make_plan
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hotline") if prefetch else None
        self._queue: deque[_Pending] = deque()
        self._source: Iterator[Batch] | None = None
        self._exhausted = False

    # --- the queue of prepared mini-batches -------------------------------------------------------

    def _prepare(self, item: _Pending) -> None:
        """Classify, split and stage one mini-batch (on the worker, or inline without prefetch)."""
        try:
            popular_steps = self.coll.popular_steps(item.batch.sparse_features)
            popular, nonpopular, n_popular = split_batch(item.batch, popular_steps)
            cold = (
                self.coll.cold_ids(nonpopular.sparse_features)
                if nonpopular is not None
                else torch.zeros(0, dtype=torch.int64)
            )
            split = Split(item.batch.labels.numel(), popular, nonpopular, n_popular, cold)
            item.split.set_result(split)
        except BaseException as e:  # the step re-raises it
            item.split.set_exception(e)
            item.staged.set_exception(e)
            return
        try:
            staged = self.coll.stage(cold, item.version) if nonpopular is not None else None
            item.staged.set_result(staged)
        except BaseException as e:
            item.staged.set_exception(e)

    def _submit(self, batch: Batch) -> _Pending:
        item = _Pending(batch, self.coll.version)
        if self._pool is not None:
            self._pool.submit(self._prepare, item)
        return item

    def _fill(self) -> None:
        while not self._exhausted and len(self._queue) < 1 + self.prefetch:
            try:
                batch = next(self._source)
            except StopIteration:
                self._exhausted = True
                return
            self._queue.append(self._submit(batch.to(self.device, non_blocking=True)))

    def _drain(self) -> list[Batch]:
        """Wait for the worker and take the queued mini-batches back, unprepared."""
        for item in self._queue:
            if self._pool is not None:
                item.staged.exception()  # waits; errors are dropped with the preparation
        batches = [item.batch for item in self._queue]
        self._queue.clear()
        return batches

    def progress(self, batches: Iterator[Batch]) -> StepResult:
        t0 = time.perf_counter()
        if batches is not self._source:  # a new epoch (or source): nothing queued carries over
            self._drain()
            self._source, self._exhausted = batches, False
        self._fill()
        if not self._queue:
            raise StopIteration
        item = self._queue.popleft()
        if self._pool is None:
            self._prepare(item)
        self._fill()  # the next mini-batches' gathers run while this one computes
        t1 = time.perf_counter()
        loss = self.hook.step(item.batch, lambda: self._step(item))
        t2 = time.perf_counter()
        if self.learn_batches and self.coll.plan is None:
            self._learn(item.batch)
        return StepResult(loss, item.batch.labels.numel(), t1 - t0, t2 - t1)

    # --- one step -----------------------------------------------------------------------------

    def _step(self, item: _Pending) -> torch.Tensor:
        split: Split = item.split.result()
        coll, hook = self.coll, self.hook
        self.dense_optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        staged: StagedRows | None = None
        waited = 0.0
        with coll.deferred_updates():
            if split.popular is not None:
                total += self._forward_backward(split.popular, split.inputs)
            if split.nonpopular is not None:
                w0 = time.perf_counter()
                staged = item.staged.result()
                # without a worker the gather ran inline, on the step's path: all of it exposed
                waited = staged.seconds if self._pool is None else time.perf_counter() - w0
                with coll.using(staged):
                    total += self._forward_backward(split.nonpopular, split.inputs)
        coll.count_step(split.popular_inputs, staged, waited)
        with hook.phase("optimizer"):
            self.dense_optimizer.step()
        return total

    def _forward_backward(self, batch: Batch, inputs: int) -> torch.Tensor:
        """A micro-batch's loss as its share of the mini-batch's mean (sum / all inputs)."""
        with (
            self.hook.phase("forward"),
            torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16),
        ):
            logits = self.model(batch.dense_features, batch.sparse_features)
        loss = loss_of(logits, batch.labels, self.loss_function, inputs)
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(value)
        with self.hook.phase("backward"):
            loss.backward()  # sparse gradients are collected, applied after both parts
        return loss.detach()

    # --- online popularity ----------------------------------------------------------------------

    def _learn(self, batch: Batch) -> None:
        self.coll.observe(batch.sparse_features)
        if self.coll.learned_batches < self.learn_batches:
            return
        queued = self._drain()
        self.coll.adopt(self.make_plan(self.coll))
        self._queue.extend(self._submit(b) for b in queued)  # prepared again for the new tiers
