"""The sparse optimizer fused into the embedding backward, and everything that depends on its kind.

One entry per kind in `KINDS` says what the rest of the tree would otherwise branch on: the
state it keeps per row and how that state is stored, the fbgemm kernel (and torchrec state name)
that runs it, its update rule for the pure-PyTorch paths, and the dense optimizer it pairs with.
Callers ask a `SparseOptimizer` (`has_state`, `state_shape`, `zero_state`, `state_as_rows`, ...),
never compare its kind with a name, so a new optimizer is one new entry here.

`sgd`:              w -= lr * g
`adagrad`:          s += g*g (per element);        w -= lr * g / (sqrt(s) + eps)
`rowwise_adagrad`:  s += mean(g*g) (one per row);  w -= lr * g / (sqrt(s) + eps)
where g is the gradient of a row summed over every lookup of that row in the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateLayout:
    """How one table's optimizer state is stored: `width(dim)` floats per row of width `dim`,
    kept as a flat [n] vector when `flat` (fbgemm's row-wise layout, width 1) and as [n, width]
    otherwise. A row store keeps the same state row-major, `width` floats after each row's
    weights; `SparseOptimizer.state_as_rows` and `state_from_rows` convert between the two."""

    width: Callable[[int], int]
    flat: bool = False


NO_STATE = StateLayout(width=lambda dim: 0)
PER_ELEMENT = StateLayout(width=lambda dim: dim)
PER_ROW = StateLayout(width=lambda dim: 1, flat=True)


def _dense_sgd(params: list, lr: float) -> torch.optim.Optimizer:
    # fused: one kernel for every parameter instead of a Python loop over them
    return torch.optim.SGD(params, lr=lr, fused=True)


def _dense_adagrad(params: list, lr: float) -> torch.optim.Optimizer:
    # both Adagrads train the dense part with plain Adagrad, as the reference does
    return torch.optim.Adagrad(params, lr=lr, eps=1e-8, fused=True)


def _add_squares(state: torch.Tensor, grad: torch.Tensor) -> None:
    state.addcmul_(grad, grad)


def _add_mean_square(state: torch.Tensor, grad: torch.Tensor) -> None:
    state.add_(grad.pow(2).mean(dim=1))


@dataclass(frozen=True)
class OptimizerKind:
    """One sparse optimizer: everything about it that code outside this module needs.

    `accumulate` adds a gradient's contribution to the state in place (None: stateless); the
    step is then `g / denominator` where the denominator is sqrt(state) + eps, per element of
    the state and broadcast across the row when the state is per row."""

    layout: StateLayout
    fbgemm: str  # the fbgemm_gpu `EmbOptimType` member that runs it (single-process and torchrec)
    dense: Callable[[list, float], torch.optim.Optimizer]
    accumulate: Callable[[torch.Tensor, torch.Tensor], None] | None = None
    torchrec_state: str | None = None  # the fused optimizer's state name: "<table>.<name>"
    dense_state: int = 0  # floats of state `dense` keeps per dense parameter (Adagrad's sum)


KINDS: dict[str, OptimizerKind] = {
    "sgd": OptimizerKind(NO_STATE, "EXACT_SGD", _dense_sgd),
    "adagrad": OptimizerKind(
        PER_ELEMENT, "EXACT_ADAGRAD", _dense_adagrad, _add_squares, "momentum1", 1
    ),
    "rowwise_adagrad": OptimizerKind(
        PER_ROW, "EXACT_ROWWISE_ADAGRAD", _dense_adagrad, _add_mean_square, "momentum1", 1
    ),
}

SPARSE_OPTIMIZERS = tuple(KINDS)


@dataclass(frozen=True)
class SparseOptimizer:
    """The optimizer fused into the embedding backward (as fbgemm's table-batched embeddings do);
    the rules of each kind are in the module docstring."""

    kind: str = "sgd"
    learning_rate: float = 0.01
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown sparse optimizer {self.kind!r}: expected one of {', '.join(KINDS)}"
            )

    @property
    def spec(self) -> OptimizerKind:
        return KINDS[self.kind]

    # --- state shapes and layout ----------------------------------------------------------------

    @property
    def has_state(self) -> bool:
        return self.spec.layout.width(1) > 0

    def state_floats(self, dim: int) -> int:
        """Optimizer-state floats stored per row of width `dim` (what placement budgets count)."""
        return self.spec.layout.width(dim)

    def state_shape(self, n: int, dim: int) -> tuple[int, ...] | None:
        """The state tensor's shape for `n` rows of width `dim` (None: no state)."""
        width = self.state_floats(dim)
        if width == 0:
            return None
        return (n,) if self.spec.layout.flat else (n, width)

    def zero_state(
        self, n: int, dim: int, device: torch.device | str | None = None
    ) -> torch.Tensor | None:
        """A fresh (all-zero) state for `n` rows of width `dim`; None without state."""
        shape = self.state_shape(n, dim)
        return None if shape is None else torch.zeros(shape, dtype=torch.float32, device=device)

    def state_as_rows(self, state: torch.Tensor | None) -> torch.Tensor | None:
        """The stored state of n rows as a row-major [n, state_floats] view."""
        if state is None:
            return None
        return state.unsqueeze(1) if self.spec.layout.flat else state

    def state_from_rows(self, rows: torch.Tensor) -> torch.Tensor | None:
        """[n, state_floats] row-major state (e.g. the columns after the weights in a row store)
        as the stored layout, contiguous; None without state."""
        if not self.has_state:
            return None
        return (rows[:, 0] if self.spec.layout.flat else rows).contiguous()

    def state_index(self, rows, col0: int, cols: int) -> tuple:
        """The index of a weight shard's state inside its table's full state: the shard covers
        `rows` (a slice or row ids) and columns [col0, col0 + cols) of the weights."""
        return (rows,) if self.spec.layout.flat else (rows, slice(col0, col0 + cols))

    @property
    def splits_by_column(self) -> bool:
        """Whether column shards may each keep their own state (a per-row state spans every
        column of the row, so a column shard of it would not be the single-process update)."""
        return not self.spec.layout.flat

    # --- the update rule --------------------------------------------------------------------------

    def accumulate_(self, state: torch.Tensor, grad: torch.Tensor) -> None:
        """Add the gradient `grad` ([n, dim]) of n rows to their state `state`, in place."""
        self.spec.accumulate(state, grad)

    def denominator_(self, state: torch.Tensor) -> torch.Tensor:
        """What divides the rows' gradient: sqrt(state) + eps, computed in place in `state`,
        shaped to broadcast over [n, dim]."""
        return self.state_as_rows(state.sqrt_().add_(self.eps))

    # --- what runs it elsewhere -------------------------------------------------------------------

    def fbgemm_type(self):
        """fbgemm's `EmbOptimType` for this optimizer (imports fbgemm)."""
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        return getattr(EmbOptimType, self.spec.fbgemm)

    def torchrec_state_key(self, table: str) -> str | None:
        """The key of table `table`'s state in torchrec's fused optimizer state dict."""
        name = self.spec.torchrec_state
        return None if name is None else f"{table}.{name}"

    def dense_state_floats(self) -> int:
        """Floats of state the paired dense optimizer keeps per dense parameter."""
        return self.spec.dense_state

    def dense_optimizer(self, params: list, lr: float) -> torch.optim.Optimizer:
        """The optimizer of the dense (MLP) parameters that trains alongside this one."""
        return self.spec.dense(params, lr)
