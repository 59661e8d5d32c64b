"""The staging train pipeline (Hotline's): the cold rows of the next mini-batches staged on a
worker while the current one computes. It trains any collection that stages (`stages`, the
contract in embeddings/staged/contract.py; embeddings/staged/collection.py holds the rows).

Per mini-batch:
1. a worker classifies its inputs (popular: every lookup, history steps included for TBSM, is a
   device row, so the input needs nothing staged), deduplicates the other inputs' cold rows,
   reads them with their optimizer state from the row store and copies them towards the device
   (pinned memory and a side stream on CUDA); it works `prefetch` mini-batches ahead;
2. the step waits for its staging (the time it waits is `exposed_gather_s`), which the collection
   loads into the device tier's staging slots after writing the previous step's cold rows home,
   refreshing any staged row a step wrote back after the worker read it;
3. the step is the plain one, over the whole mini-batch: one forward, one backward with the sparse
   optimizer fused in (each row, hot or staged, updated once from its summed gradient), one dense
   optimizer step. Popular and non-popular inputs run together: the staging is done before the
   step starts, so a separate popular micro-batch would hide nothing and cost a second pass.
Fed the same mini-batches it computes what `--placement device` computes.

With `learn_batches`, the first mini-batches train with every row in the store while the
collection counts accesses; then a plan is made under the hot budget (`make_plan`) and the hot
rows move to the device.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.pipelines.base import PlainTrainPipeline, StepHook, StepResult
from embeddings.staged.contract import StagingCollection
from hybrid_dlrm.common.thread_cpu import name_os_thread


def _one_thread() -> None:
    """The worker's ops run on its own thread only: a second team of intra-op threads would
    spin against the step's own on a small machine (measured: backward 3.5x slower on 2 cores).
    Its kernel name, `hotline`, tells it apart in `top -H` and per-thread CPU counts
    (hybrid_dlrm/common/thread_cpu.py)."""
    torch.set_num_threads(1)
    name_os_thread("hotline")


@dataclass
class _Pending:
    batch: Batch  # on the training device
    features: KeyedJaggedTensor  # its sparse features where the loader made them (host memory)
    version: int = -1  # the host tier's write-backs when its staging was submitted
    staged: Future | None = None  # None: not submitted yet


class HotlineTrainPipeline(PlainTrainPipeline):
    def __init__(
        self,
        model: torch.nn.Module,
        dense_optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str = "fp32",
        loss_function: str = "bce",
        hook: StepHook | None = None,
        prefetch: int = 1,
        learn_batches: int = 0,
        make_plan: Callable[[StagingCollection], object] | None = None,
        written=None,
    ) -> None:
        super().__init__(
            model, dense_optimizer, device, precision, loss_function, hook, written=written
        )
        self.coll: StagingCollection = model.embeddings
        self.prefetch = prefetch
        self.learn_batches = learn_batches
        self.make_plan = make_plan
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="hotline", initializer=_one_thread)
            if prefetch
            else None
        )
        self._queue: deque[_Pending] = deque()
        self._source: Iterator[Batch] | None = None
        self._exhausted = False

    # --- the queue of staged mini-batches ---------------------------------------------------------

    def _prepare(self, item: _Pending, staged: Future, version: int) -> None:
        """Classify and stage one mini-batch (on the worker, or inline without prefetch). The
        future and version are the ones given at submission: a renewal may have replaced the
        item's (`_renew`) before the worker got here."""
        try:
            inputs = item.batch.labels.numel()
            staged.set_result(self.coll.stage(item.features, inputs, version))
        except BaseException as e:  # the step re-raises it
            staged.set_exception(e)

    def _submit(self, item: _Pending) -> None:
        item.version, item.staged = self.coll.version, Future()
        if self._pool is not None:
            self._pool.submit(self._prepare, item, item.staged, item.version)
        else:
            self._prepare(item, item.staged, item.version)

    def _fill(self) -> None:
        """The next mini-batches from the loader, queued; their stagings are submitted by the
        step, once it has sent the step before it's rows home (`_step`)."""
        while not self._exhausted and len(self._queue) < 1 + self.prefetch:
            try:
                batch = next(self._source)
            except StopIteration:
                self._exhausted = True
                return
            on_device = batch.to(self.device, non_blocking=True)
            self._queue.append(_Pending(on_device, batch.sparse_features))

    def _drain(self) -> list[Batch]:
        """Wait for the worker and take the queued mini-batches back, unstaged."""
        self.settle()  # errors are dropped with the staging
        batches = [item.batch for item in self._queue]
        self._queue.clear()
        return batches

    def settle(self) -> None:
        """Wait for the stagings in flight (they stay queued, staged): a benchmark that
        interleaves trainers in one process calls it so that one's worker does not run beside
        another's steps."""
        for item in self._queue:
            if item.staged is not None:
                item.staged.exception()

    def progress(self, batches: Iterator[Batch]) -> StepResult:
        t0 = time.perf_counter()
        if batches is not self._source:  # a new epoch (or source): nothing queued carries over
            self._drain()
            self._source, self._exhausted = batches, False
        self._fill()
        if not self._queue:
            raise StopIteration
        item = self._queue.popleft()
        self._fill()
        t1 = time.perf_counter()
        loss = self.hook.step(item.batch, lambda: self._step(item))
        t2 = time.perf_counter()
        if self.learn_batches and self.coll.plan is None:
            self._learn(item.batch)
        return StepResult(loss, item.batch.labels.numel(), t1 - t0, t2 - t1)

    def _step(self, item: _Pending) -> torch.Tensor:
        w0 = time.perf_counter()
        if item.staged is None:  # no worker, or the first mini-batch: staged on the step's path
            self._submit(item)
        staged = item.staged.result()
        waited = staged.seconds if self._pool is None else time.perf_counter() - w0
        with self.coll.using(staged, waited):
            # The previous step's rows are home now: the next mini-batches' stagings read them
            # there, and only rows this step updates need renewing when they are loaded. A
            # staging already in flight read before they were home: the worker renews it next
            # (it runs its jobs in order, so after the staging's reads), off the step's thread.
            for queued in self._queue:
                if self._pool is None:
                    continue
                if queued.staged is None:
                    self._submit(queued)
                else:
                    self._renew(queued)
            loss = self.step(item.batch)
        return loss

    def _renew(self, item: _Pending) -> None:
        """Have the worker renew `item`'s staging up to the write-backs so far (a collection
        that can: `renewal`, embeddings/staged/contract.py); the step waits for that too."""
        renewal = getattr(self.coll, "renewal", None)
        renew = renewal(item.version) if renewal is not None else None
        if renew is None:
            return
        before, after = item.staged, Future()
        item.version, item.staged = self.coll.version, after
        self._pool.submit(self._renewed, before, after, renew)

    @staticmethod
    def _renewed(before: Future, after: Future, renew) -> None:
        try:
            staged = before.result()
            renew(staged)
            after.set_result(staged)
        except BaseException as e:  # the step re-raises it
            after.set_exception(e)

    # --- online popularity ----------------------------------------------------------------------

    def _learn(self, batch: Batch) -> None:
        self.coll.observe(batch.sparse_features)
        if self.coll.learned_batches < self.learn_batches:
            return
        queued = self._drain()
        self.coll.adopt(self.make_plan(self.coll))
        self._queue.extend(_Pending(b, b.sparse_features) for b in queued)  # staged anew
