"""The fused embedding collection: every table in one table-batched op, optimizer fused into backward.

It has the face of torchrec's `EmbeddingBagCollection` (`forward(kjt) -> KeyedTensor`, keys in
feature order). The work is done by fbgemm's `SplitTableBatchedEmbeddingBagsCodegen` where fbgemm
has a kernel for the device, otherwise by `TorchTableBatchedEmbedding` (same results).

The backend is deliberately not a registered submodule: its weights are updated by its own fused
optimizer, so they must not reach the dense optimizer through `.parameters()`, and the state dict
is written in a placement-independent form (`<table>.weight`, one full tensor per table) rather
than in the backend's internal layout.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embeddings._fbgemm import fbgemm_available
from embeddings.config import SparseOptimizer, TableSpec
from embeddings.torch_tbe import TorchTableBatchedEmbedding

log = logging.getLogger(__name__)

BACKENDS = ("auto", "fbgemm", "torch")


def _fbgemm_has_kernels_for(device: torch.device) -> bool:
    if not fbgemm_available():
        return False
    if device.type == "cpu":
        return True
    # The CPU build of fbgemm registers no CUDA kernels for table-batched embeddings.
    import importlib.metadata as md

    try:
        md.version("fbgemm-gpu")
        return device.type == "cuda"
    except md.PackageNotFoundError:
        return False


def _make_fbgemm(tables: list[TableSpec], opt: SparseOptimizer, device: torch.device) -> nn.Module:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
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
    kind = {
        "sgd": EmbOptimType.EXACT_SGD,
        "adagrad": EmbOptimType.EXACT_ADAGRAD,
        "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    }[opt.kind]
    return SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(t.num_embeddings, t.embedding_dim, loc, compute) for t in tables],
        optimizer=kind,
        learning_rate=opt.learning_rate,
        eps=opt.eps,
        pooling_mode=PoolingMode.SUM,
        device=device,
    )


def uniform_init_(weights: list[torch.Tensor], seed: int) -> None:
    """The reference's initialisation, U(-sqrt(1/rows), +sqrt(1/rows)), seeded per table."""
    for i, w in enumerate(weights):
        gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + i)
        bound = (1.0 / w.shape[0]) ** 0.5
        if w.device.type == "cpu":
            w.uniform_(-bound, bound, generator=gen)
        else:
            w.copy_(torch.empty(w.shape).uniform_(-bound, bound, generator=gen))


class FusedEmbeddingBagCollection(nn.Module):
    """Sum-pooled embedding bags for many features, sparse updates fused into backward."""

    def __init__(
        self,
        tables: list[TableSpec],
        optimizer: SparseOptimizer = SparseOptimizer(),
        device: torch.device | str | None = None,
        backend: str = "auto",
        seed: int = 0,
    ) -> None:
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
        with torch.no_grad():
            uniform_init_(self.table_weights(), seed)
        log.debug("embedding collection: %d tables on %s via %s", len(tables), self.device, backend)

    # --- the collection contract -------------------------------------------------------------

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        if features.keys() != self.feature_names:
            features = features.permute([features.keys().index(f) for f in self.feature_names])
        values = features.values()
        offsets = features.offsets()
        if values.dtype != offsets.dtype:
            values, offsets = values.long(), offsets.long()
        pooled = self._impl(values, offsets)
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=pooled)

    def set_learning_rate(self, lr: float) -> None:
        self._impl.set_learning_rate(float(lr))

    def table_weights(self) -> list[torch.Tensor]:
        """Every table as one dense [rows, dim] tensor (views into the live weights)."""
        return list(self._impl.split_embedding_weights())

    def optimizer_states(self) -> list[torch.Tensor | None]:
        """Per table the fused optimizer's state (views), None for SGD."""
        if self.optimizer.kind == "sgd":
            return [None] * len(self.tables)
        states = self._impl.split_optimizer_states()
        return [s[0] if isinstance(s, (list, tuple)) else s for s in states]

    def sparse_state_dict(self) -> dict[str, torch.Tensor]:
        """The fused optimizer's state, one tensor per table, for checkpoints."""
        return {
            f"{t.name}.{self.optimizer.kind}_state": s.detach()
            for t, s in zip(self.tables, self.optimizer_states())
            if s is not None
        }

    def load_sparse_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        _copy_named(
            state,
            {
                f"{t.name}.{self.optimizer.kind}_state": s
                for t, s in zip(self.tables, self.optimizer_states())
                if s is not None
            },
            what="sparse optimizer state",
        )

    # --- placement-independent state dict ----------------------------------------------------

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: D401
        for t, w in zip(self.tables, self.table_weights()):
            destination[f"{prefix}{t.name}.weight"] = w if keep_vars else w.detach()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        mine = {f"{prefix}{t.name}.weight": w for t, w in zip(self.tables, self.table_weights())}
        for key, dst in mine.items():
            if key not in state_dict:
                missing_keys.append(key)
                continue
            src = state_dict[key]
            if tuple(src.shape) != tuple(dst.shape):
                error_msgs.append(
                    f"{key}: shape {tuple(src.shape)} in the checkpoint, {tuple(dst.shape)} in the model"
                )
                continue
            with torch.no_grad():
                dst.copy_(src)
        # The collection has no submodules, so anything else under its prefix is not ours.
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in mine)


def _copy_named(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], what: str) -> None:
    missing = sorted(set(dst) - set(src))
    if missing:
        raise KeyError(
            f"{what}: missing {', '.join(missing[:3])}{'...' if len(missing) > 3 else ''}"
        )
    with torch.no_grad():
        for key, d in dst.items():
            s = src[key]
            if tuple(s.shape) != tuple(d.shape):
                raise ValueError(
                    f"{what}: {key} has shape {tuple(s.shape)}, expected {tuple(d.shape)}"
                )
            d.copy_(s)
