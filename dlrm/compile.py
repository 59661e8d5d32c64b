"""`--compile`: the model's dense part compiled by TorchInductor; the embedding collection stays
eager (its fused table-batched op is already one kernel per direction).

What is compiled is the model's `dense_forward(dense, pooled)`: everything after the embedding
lookup (DLRM: bottom MLP, interaction, top MLP; TBSM: the step encoder's MLPs and interaction and
the time-series layer). The GEMMs stay oneDNN/cuBLAS calls; what compiling buys is the glue
around them (casts under bf16 autocast, the interaction's gathers and concatenations, ReLU and its
backward) as a few fused loops instead of dozens of eager ops. On a CPU with bf16 units that glue
is about a third of a bf16 step; in fp32 the step is GEMM-bound and compiling gains nothing
measurable, so `auto` compiles bf16 only (docs/speed.md has the figures).

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

import torch

log = logging.getLogger(__name__)


def wanted(setting: bool | None, precision: str) -> bool:
    """`--compile` true/false as given; `auto` (None): bf16, where the step is not GEMM-bound."""
    return precision == "bf16" if setting is None else setting


class CompiledDenseForward:
    """`model.dense_forward` compiled; eager from the first compile failure on (one log line)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.eager = model.dense_forward
        self.compiled = torch.compile(self.eager)
        self.fell_back = False

    def __call__(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        if self.fell_back:
            return self.eager(dense, pooled)
        torch._dynamo.maybe_mark_dynamic(dense, 0)
        torch._dynamo.maybe_mark_dynamic(pooled, 0)
        try:
            return self.compiled(dense, pooled)
        except torch._dynamo.exc.BackendCompilerFailed as e:
            reason = str(e).strip().splitlines()[0]
            log.warning("--compile: TorchInductor cannot compile the dense part (%s); it runs "
                        "eager", reason)  # fmt: skip
            self.fell_back = True
            return self.eager(dense, pooled)


def compile_dense_part(model: torch.nn.Module) -> CompiledDenseForward | None:
    """From now on `model.dense_forward` (and so `model.forward`) runs compiled. A model without
    a `dense_forward` (one a library user brought) runs eager, after one log line."""
    if not callable(getattr(model, "dense_forward", None)):
        log.warning("--compile: %s has no dense_forward(dense, pooled) to compile; it runs eager",
                    type(model).__name__)  # fmt: skip
        return None
    compiled = CompiledDenseForward(model)
    model.dense_forward = compiled
    return compiled
