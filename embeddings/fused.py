"""The fused embedding collection: every table in one table-batched op, optimizer fused into backward.

It has the face of torchrec's `EmbeddingBagCollection` (`forward(kjt) -> KeyedTensor`, keys in
feature order). The work is done by fbgemm's `SplitTableBatchedEmbeddingBagsCodegen` where fbgemm
has a kernel for the device, otherwise by `TorchTableBatchedEmbedding` (same results).

The backend is deliberately not a registered submodule: its weights are updated by its own fused
optimizer, so they must not reach the dense optimizer through `.parameters()`, and the state dict
is written in the contract's placement-independent form (`<table>.weight`, one full tensor per
table) rather than in the backend's internal layout.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embeddings import cpu_tbe
from embeddings._fbgemm import fbgemm_has_kernels_for as _fbgemm_has_kernels_for
from embeddings.collection import EmbeddingCollection
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.kjt_ops import in_feature_order
from embeddings.torch_tbe import TorchTableBatchedEmbedding
from embeddings.transfer_stats import no_transfer_counters

log = logging.getLogger(__name__)

BACKENDS = ("auto", "fbgemm", "torch")


def _make_fbgemm(tables: list[TableSpec], opt: SparseOptimizer, device: torch.device) -> nn.Module:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    if device.type == "cpu":
        loc, compute = EmbeddingLocation.HOST, ComputeDevice.CPU
    else:
        loc, compute = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
    return SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(t.num_embeddings, t.embedding_dim, loc, compute) for t in tables],
        optimizer=opt.fbgemm_type(),
        learning_rate=opt.learning_rate,
        eps=opt.eps,
        pooling_mode=PoolingMode.SUM,
        device=device,
    )


def _table_init(rows: int, index: int, seed: int) -> tuple[torch.Generator, float]:
    return torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + index), (1.0 / rows) ** 0.5


def uniform_init_(weights: list[torch.Tensor], seed: int) -> None:
    """The reference's initialisation, U(-sqrt(1/rows), +sqrt(1/rows)), seeded per table."""
    for i, w in enumerate(weights):
        if w.device.type == "cpu":
            gen, bound = _table_init(w.shape[0], i, seed)
            w.uniform_(-bound, bound, generator=gen)
        else:
            w.copy_(uniform_table(w.shape[0], w.shape[1], i, seed))


def uniform_table(rows: int, dim: int, index: int, seed: int) -> torch.Tensor:
    """Table `index`'s initial weights as `uniform_init_` makes them, as a new CPU tensor (a tier
    holding some of its rows starts them at the same values)."""
    gen, bound = _table_init(rows, index, seed)
    return torch.empty(rows, dim).uniform_(-bound, bound, generator=gen)


class FusedEmbeddingBagCollection(EmbeddingCollection):
    """Every table on one device in one table-batched op (the `device` placement)."""

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer = SparseOptimizer(),
        device: torch.device | str | None = None,
        backend: str = "auto",
        seed: int = 0,
        init: bool = True,
    ) -> None:
        """`init=False` leaves the initial values to the caller (a tier that copies its rows in)."""
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown embedding backend {backend!r}: expected one of {BACKENDS}")
        if not tables:
            raise ValueError("an embedding collection needs at least one table")
        self.tables = list(tables)
        self.feature_names = [t.feature_name for t in tables]
        self.dims = [t.embedding_dim for t in tables]
        self.optimizer = optimizer
        self.device = torch.device(device or "cpu")
        if backend == "auto":
            backend = "fbgemm" if _fbgemm_has_kernels_for(self.device) else "torch"
        elif backend == "fbgemm" and not _fbgemm_has_kernels_for(self.device):
            raise ValueError(f"fbgemm has no table-batched embedding kernel for {self.device} here")
        self.backend = backend
        if backend == "fbgemm":
            impl = _make_fbgemm(self.tables, optimizer, self.device)
        else:
            impl = TorchTableBatchedEmbedding(
                [t.num_embeddings for t in tables], self.dims, optimizer, self.device
            )
        object.__setattr__(self, "_impl", impl)  # not a submodule: see the module docstring
        # what a lookup calls: fbgemm's module, or its forward with our parallel SGD update
        lookup = impl
        if backend == "fbgemm" and cpu_tbe.applies(optimizer, self.device):
            lookup = cpu_tbe.ParallelUpdateLookup(impl)
        object.__setattr__(self, "_lookup", lookup)
        if init:
            with torch.no_grad():
                uniform_init_(self.table_weights(), seed)
        log.debug("embedding collection: %d tables on %s via %s", len(tables), self.device, backend)

    # --- the collection contract -------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        features = in_feature_order(features, self.feature_names)
        values = features.values()
        offsets = features.offsets()
        if values.dtype != offsets.dtype:
            values, offsets = values.long(), offsets.long()
        pooled = self._lookup(values, offsets)
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=pooled)

    def set_learning_rate(self, lr: float) -> None:
        self._impl.set_learning_rate(float(lr))

    def table_weights(self) -> list[torch.Tensor]:
        """Every table as one dense [rows, dim] tensor (views into the live weights)."""
        return list(self._impl.split_embedding_weights())

    def optimizer_states(self) -> list[torch.Tensor | None]:
        """Per table the fused optimizer's state (views, `optimizer.state_shape`), None for SGD."""
        if not self.optimizer.has_state:
            return [None] * len(self.tables)
        states = self._impl.split_optimizer_states()
        return [s[0] if isinstance(s, (list, tuple)) else s for s in states]

    def pooled(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Pooled embeddings [batch, sum dims] of table-major bags (fbgemm's layout), the fused
        optimizer in backward: what another collection's tier calls directly."""
        return self._lookup(values, offsets)

    def counters(self) -> dict:
        return no_transfer_counters()

    def logged_counters(self) -> tuple[str, ...]:
        return ()  # every row on the device: nothing moves, nothing to log per step

    def placement_info(self) -> dict:
        return {"kind": "device", "backend": self.backend}
