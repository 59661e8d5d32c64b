"""What the run asks of a model, declared (as torchrec's `EmbeddingBagCollectionInterface` declares
what a collection is): the trainer, the train pipelines, `--compile`, checkpoints and serving
read a model only through these members, so a new model kind is its module and a registration
(dlrm/models/kinds.py), never edits where models are used.

Every model is an `nn.Module` built as `model_class(arch, embeddings, seed=seed)` around an
embedding collection it never looks inside: training hands it float tables in any placement,
serving quantized ones (its quantized form is the same class, its linear layers converted by
dlrm/models/quantized.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # torch costs seconds to import; `--help` reads the registry, not this
    import torch
    from torch import nn
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@runtime_checkable
class ModelArch(Protocol):
    """A model's architecture: a frozen dataclass whose fields are plain values (an artifact's
    manifest holds them as JSON and rebuilds the model from them)."""

    num_dense: int  # dense features per row: serving checks raw lines and batches against it
    num_sparse: int  # embedding tables: serving checks an artifact's tables against it
    embedding_dim: int  # width of every pooled embedding


@runtime_checkable
class RecModel(Protocol):
    """A recommendation model as the run uses it."""

    # its architecture: checkpoints and artifacts record it, serving rebuilds the model from it
    arch: Any
    # the embedding collection, readable and assignable at the kind's `embedding_prefix`: the
    # trainer syncs, checkpoints and steps it; serving swaps in quantized or pooled stand-ins
    embeddings: nn.Module

    def dense_parameters(self) -> list[nn.Parameter]:
        """What the dense optimizer steps (embedding rows are updated inside backward)."""
        ...

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """One logit per label (evaluation, the plain train step, the Predictor): `dense` and
        `sparse` hold the kind's `rows_per_sample` rows per label."""
        ...

    def dense_forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Everything after the lookup, from pooled embeddings [rows, tables * dim]: what
        `--compile` compiles and what pipelines that look rows up themselves (staging,
        Slipstream, `Predictor.predict_rows`) call."""
        ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Checkpoints and export: tables under the kind's `embedding_prefix`, the rest dense."""
        ...

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """Resume, and serving's dense weights (strict=False: tables are loaded apart)."""
        ...

    def named_modules(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Module]]:
        """The quantized form converts every `nn.Linear` it finds by path."""
        ...

    def train(self, mode: bool = True) -> Any:
        """Training and evaluation switch modes (dropout-free models too: the contract is nn's)."""
        ...

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """The model is built on CPU and moved to the run's device."""
        ...
