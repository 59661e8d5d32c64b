"""`--compile`: the model's dense part compiled by TorchInductor; the embedding collection stays
eager (its fused table-batched op is already one kernel per direction).

What is compiled is the model's `dense_forward(dense, pooled)`: everything after the embedding
lookup (DLRM: bottom MLP, interaction, top MLP; TBSM: the step encoder's MLPs and interaction and
the time-series layer). The GEMMs stay oneDNN/cuBLAS calls; what compiling buys is the glue
around them (casts under bf16 autocast, the interaction's gathers and concatenations, ReLU and its
backward) as a few fused loops instead of dozens of eager ops. On a CPU with bf16 units that glue
is about a third of a bf16 step. For a DLRM, training compiles its written-out step instead
(dlrm/pipelines/dense_step.py: forward, loss, backward and plain SGD as one graph, which also cuts the
step's fixed costs); `dense_forward` then serves evaluation. `auto` compiles where the compile
pays for itself: bf16 runs of at least BF16_AUTO_MIN_STEPS steps, and fp32 where the written-out
step gains enough in long runs (see `wanted`; docs/speed.md has the figures).

The batch dimension is marked dynamic, so one graph serves the training batch, an epoch's short
last batch and the evaluation batch size: training and evaluation (no autograd) are two graphs,
and nothing recompiles per step. Where Inductor cannot build (no C++ compiler, for instance) the
first call logs one line and the model runs eager from then on.

The compiled function is an attribute of the model instance, not a wrapper module: parameter
names, state dicts and checkpoints are those of the eager model, and a compiled run resumes
bit-exactly on CPU (the same graph compiles to the same kernels).
"""

from __future__ import annotations

import logging
import time

import torch

from dlrm.pipelines import dense_step
from dlrm.pipelines.dense_step import WrittenDenseStep

log = logging.getLogger(__name__)


# TorchInductor; tests trace with "eager" (Dynamo only: seconds less per graph, eager numerics)
BACKEND = "inductor"

# `auto` compiles fp32 too where the step's fixed costs, which compiling cuts, are a large share
# of it and the run is long enough to pay for the compile (20-40 s cold, seconds from Inductor's
# cache): with a DLRM's written-out step fp32 at batch 128 went from 1.31x to 1.50x the naive
# step's CPU time (7.6 -> 6.9 ms), at batch 2048 about 5% (docs/speed.md).
FP32_AUTO_MAX_BATCH = 512
FP32_AUTO_MIN_STEPS = 20_000

# bf16 compiles under `auto` only in runs long enough for the compile to pay: the compile
# against the time it saves per step, measured by scripts/bench_compile_pays.py on this
# project's 2-core AMD EPYC (avx512_bf16) with a cold Inductor cache (a user's first run; from
# the cache it is seconds): figures and derivation in docs/speed.md#--compile.
BF16_AUTO_MIN_STEPS = 1_000


def wanted(
    setting: bool | None, precision: str, batch_size: int = 0, steps: int = 0,
    written: bool = False,
) -> bool:  # fmt: skip
    """`--compile` true/false as given; `auto` (None): bf16 in runs of at least
    BF16_AUTO_MIN_STEPS steps (`steps` 0: a length not known, as a library call without one:
    compiled), and fp32 for a model with a written-out step (`written`) at small batches in long
    runs."""
    if setting is not None:
        return setting
    if precision == "bf16":
        return steps == 0 or steps >= BF16_AUTO_MIN_STEPS
    return written and batch_size <= FP32_AUTO_MAX_BATCH and steps >= FP32_AUTO_MIN_STEPS


def _step_options(step: WrittenDenseStep) -> dict | None:
    """Inductor's options for the written-out step. fp32: the graph's wrapper in C++ rather than
    Python (`cpp_wrapper`), 7% less CPU per step at batch 128 (per-round ratio, 9 rounds), for
    about 10 s more of compiling; bf16 measured no different, so it keeps the default."""
    if BACKEND == "inductor" and step.dtype == torch.float32:
        return {"cpp_wrapper": True}
    return None


class CompiledDenseForward:
    """`model.dense_forward` compiled, and for a DLRM its written-out training step
    (dlrm/pipelines/dense_step.py) as one more graph; both eager from the first compile failure on (one log
    line)."""

    def __init__(self, model: torch.nn.Module, train_step: WrittenDenseStep | None = None) -> None:
        self.eager = model.dense_forward
        self.compiled = torch.compile(self.eager, backend=BACKEND)
        self.written = train_step
        self.compiled_step = (
            torch.compile(train_step.step, backend=BACKEND, options=_step_options(train_step))
            if train_step is not None
            else None
        )
        self._lr = torch.zeros((), dtype=torch.float64)
        self.fell_back = False
        # the first call of each graph compiles it: its wall time is the summary's compile_s
        # (the one step it also runs is noise beside 10-60 s of compiling)
        self.compile_s = 0.0
        self._called: set[int] = set()

    def __call__(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        if self.fell_back:
            return self.eager(dense, pooled)
        torch._dynamo.maybe_mark_dynamic(dense, 0)
        torch._dynamo.maybe_mark_dynamic(pooled, 0)
        return self._compiled_or_eager(self.compiled, self.eager, dense, pooled)

    def writes_steps(self) -> bool:
        """Whether training steps run the written-out step (a DLRM that compiled so far)."""
        return self.compiled_step is not None and not self.fell_back

    def train_step(self, dense, pooled, labels, optimizer: torch.optim.Optimizer):
        """The written-out step (dlrm/pipelines/dense_step.py): (loss, dL/dpooled, [(parameter, gradient)])
        for `optimizer` to apply, or, where it is plain SGD, the update applied and no gradients.
        None where there is no written-out step or compiling failed: the caller then runs the
        autograd step."""
        if self.compiled_step is None or self.fell_back:
            return None
        for t in (dense, pooled, labels):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        it, w = self.written.model.interaction, self.written
        lr = dense_step.plain_sgd_lr(optimizer, w.params)
        if lr is not None:  # a tensor: a new learning rate must not recompile the step
            self._lr.fill_(lr)
        args = (dense, pooled, labels, w.params, it.tril_flat, it.grad_map, it.diagonal,
                None if lr is None else self._lr)  # fmt: skip
        with torch.no_grad():  # the step computes its own gradients
            out = self._compiled_or_eager(self.compiled_step, lambda *a: None, *args)
        if out is None:
            return None
        loss, grad_pooled, grads = out
        return loss, grad_pooled, list(zip(w.params, grads))

    def _compiled_or_eager(self, compiled, eager, *args):
        if id(compiled) not in self._called:
            self._called.add(id(compiled))
            t0 = time.perf_counter()
            try:
                return self._compiled_or_eager(compiled, eager, *args)
            finally:
                self.compile_s += time.perf_counter() - t0
        try:
            return compiled(*args)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            reason = str(e).strip().splitlines()[0]
            log.warning("--compile: TorchInductor cannot compile the dense part (%s); it runs "
                        "eager", reason)  # fmt: skip
            self.fell_back = True
            return eager(*args)


def compile_dense_part(
    model: torch.nn.Module, precision: str = "fp32", loss_function: str = "bce"
) -> CompiledDenseForward | None:
    """From now on `model.dense_forward` (and so `model.forward`) runs compiled, and for a DLRM
    `train_step` gives its written-out training step compiled. A model without a `dense_forward`
    (one a library user brought) runs eager, after one log line."""
    if not callable(getattr(model, "dense_forward", None)):
        log.warning("--compile: %s has no dense_forward(dense, pooled) to compile; it runs eager",
                    type(model).__name__)  # fmt: skip
        return None
    written = None
    if dense_step.supports(model):
        written = dense_step.WrittenDenseStep(model, precision, loss_function)
    compiled = CompiledDenseForward(model, written)
    model.dense_forward = compiled
    return compiled
