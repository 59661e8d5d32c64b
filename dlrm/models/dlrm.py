"""DLRM (Naumov et al. 2019) with the architecture and initialisation of facebookresearch/dlrm.

bottom MLP(dense) -> x;  embedding collection(sparse) -> e_1..e_k;  interaction(x, e) -> z;
top MLP(z) -> logit.  The model returns logits; the loss is BCE with logits.

The embedding collection is passed in: the model never knows where rows live.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

INTERACTIONS = ("dot", "cat")


def check_bottom_mlp(bottom: tuple[int, ...], num_dense: int, embedding_dim: int) -> None:
    """The bottom MLP reads the dense features and must output one embedding-sized vector."""
    if not bottom or bottom[0] != num_dense:
        raise ValueError(
            f"--arch-mlp-bot: first width must be the number of dense features "
            f"({num_dense}), got {'-'.join(map(str, bottom))}"
        )
    if bottom[-1] != embedding_dim:
        raise ValueError(
            f"--arch-mlp-bot: last width ({bottom[-1]}) must equal --arch-sparse-feature-size ({embedding_dim})"
        )


@dataclass(frozen=True)
class DLRMArch:
    """Widths as in the reference's flags: `bottom` includes the dense input width; `top` excludes
    its input width, which follows from the interaction."""

    num_dense: int
    embedding_dim: int
    num_sparse: int
    bottom: tuple[int, ...]  # e.g. (13, 512, 256, 64, 16)
    top: tuple[int, ...]  # e.g. (512, 256, 1)
    interaction: str = "dot"
    interaction_itself: bool = False

    def __post_init__(self) -> None:
        if self.interaction not in INTERACTIONS:
            raise ValueError(f"--arch-interaction-op: expected dot or cat, got {self.interaction!r}")
        check_bottom_mlp(self.bottom, self.num_dense, self.embedding_dim)
        if not self.top or self.top[-1] != 1:
            raise ValueError(
                f"--arch-mlp-top: last width must be 1 (one logit), got {'-'.join(map(str, self.top))}"
            )

    @property
    def top_input(self) -> int:
        n = self.num_sparse + 1
        if self.interaction == "cat":
            return n * self.embedding_dim
        pairs = n * (n + 1) // 2 if self.interaction_itself else n * (n - 1) // 2
        return pairs + self.embedding_dim


def make_mlp(widths: tuple[int, ...], final_activation: bool, generator: torch.Generator) -> nn.Sequential:
    """Linear+ReLU layers, initialised as the reference does (normal, Xavier-like scale)."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        lin = nn.Linear(fan_in, fan_out)
        with torch.no_grad():
            lin.weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)), generator=generator)
            lin.bias.normal_(0.0, math.sqrt(1.0 / fan_out), generator=generator)
        layers.append(lin)
        if i < len(widths) - 2 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Interaction(nn.Module):
    """`dot`: pairwise dot products of [x, e_1..e_k] (strict lower triangle, or with the diagonal
    when `itself`), concatenated after x.  `cat`: plain concatenation."""

    def __init__(self, num_features: int, kind: str, itself: bool) -> None:
        super().__init__()
        self.kind = kind
        offset = 1 if itself else 0
        li = [i for i in range(num_features) for j in range(i + offset)]
        lj = [j for i in range(num_features) for j in range(i + offset)]
        flat = torch.tensor([i * num_features + j for i, j in zip(li, lj)], dtype=torch.long)
        self.register_buffer("tril_flat", flat, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """dense [B, D], sparse [B, k*D] (features side by side) -> [B, top input width]."""
        batch, dim = dense.shape
        if self.kind == "cat":
            return torch.cat([dense, sparse.to(dense.dtype)], dim=1)
        t = torch.cat([dense, sparse.to(dense.dtype)], dim=1).view(batch, -1, dim)
        z = torch.bmm(t, t.transpose(1, 2)).flatten(1)
        return torch.cat([dense, z.index_select(1, self.tril_flat)], dim=1)


class DLRM(nn.Module):
    def __init__(self, arch: DLRMArch, embeddings: nn.Module, seed: int = 0) -> None:
        super().__init__()
        self.arch = arch
        gen = torch.Generator().manual_seed(seed)
        self.bottom_mlp = make_mlp(arch.bottom, final_activation=True, generator=gen)
        self.embeddings = embeddings
        self.interaction = Interaction(arch.num_sparse + 1, arch.interaction, arch.interaction_itself)
        self.top_mlp = make_mlp((arch.top_input, *arch.top), final_activation=False, generator=gen)

    def dense_parameters(self) -> list[nn.Parameter]:
        """What the dense optimizer steps; embedding rows are updated inside backward."""
        return [*self.bottom_mlp.parameters(), *self.top_mlp.parameters()]

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        x = self.bottom_mlp(dense)
        pooled = self.embeddings(sparse).values()
        z = self.interaction(x, pooled)
        return self.top_mlp(z).squeeze(1)
