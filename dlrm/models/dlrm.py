"""DLRM (Naumov et al. 2019) with the architecture and initialisation of facebookresearch/dlrm.

bottom MLP(dense) -> x;  embedding collection(sparse) -> e_1..e_k;  interaction(x, e) -> z;
top MLP(z) -> logit.  The model returns logits; the loss is BCE with logits.

The embedding collection is passed in: the model never knows where rows live.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from dlrm.errors import ArchError
from dlrm.models.kinds import ModelKind

if TYPE_CHECKING:  # torchrec costs seconds to import: serving raw lines needs no KJT
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

INTERACTIONS = ("dot", "cat", "dcn")


def check_bottom_mlp(bottom: tuple[int, ...], num_dense: int, embedding_dim: int) -> None:
    """The bottom MLP reads the dense features and must output one embedding-sized vector."""
    if not bottom or bottom[0] != num_dense:
        raise ArchError(
            "bottom",
            f"first width must be the number of dense features ({num_dense}), got {'-'.join(map(str, bottom))}",
        )
    if bottom[-1] != embedding_dim:
        raise ArchError(
            "bottom",
            f"last width ({bottom[-1]}) must equal the embedding dimension ({embedding_dim})",
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
    dcn_num_layers: int = 3  # `dcn` only, as torchrec's DLRM_DCN
    dcn_low_rank_dim: int = 512

    def __post_init__(self) -> None:
        if self.interaction not in INTERACTIONS:
            raise ArchError(
                "interaction", f"expected dot or cat, or dcn (DCNv2), got {self.interaction!r}"
            )
        check_dcn(self.dcn_num_layers, self.dcn_low_rank_dim)
        check_bottom_mlp(self.bottom, self.num_dense, self.embedding_dim)
        if not self.top or self.top[-1] != 1:
            raise ArchError(
                "top", f"last width must be 1 (one logit), got {'-'.join(map(str, self.top))}"
            )

    @property
    def top_input(self) -> int:
        return interaction_width(
            self.num_sparse + 1, self.embedding_dim, self.interaction, self.interaction_itself
        )


def interaction_width(num_features: int, dim: int, kind: str, itself: bool) -> int:
    """Width of Interaction's output for num_features vectors of width dim."""
    if kind in ("cat", "dcn"):  # DCN keeps its input's width
        return num_features * dim
    pairs = (
        num_features * (num_features + 1) // 2 if itself else num_features * (num_features - 1) // 2
    )
    return pairs + dim


def check_dcn(num_layers: int, low_rank_dim: int) -> None:
    if num_layers < 1:
        raise ArchError("dcn_num_layers", f"expected a positive integer, got {num_layers}")
    if low_rank_dim < 1:
        raise ArchError("dcn_low_rank_dim", f"expected a positive integer, got {low_rank_dim}")


def make_mlp(
    widths: tuple[int, ...], final_activation: bool, generator: torch.Generator
) -> nn.Sequential:
    """Linear+ReLU layers, initialised as the reference does (normal, Xavier-like scale)."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        lin = linear_layer(fan_in, fan_out)
        with torch.no_grad():
            lin.weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)), generator=generator)
            lin.bias.normal_(0.0, math.sqrt(1.0 / fan_out), generator=generator)
        layers.append(lin)
        if i < len(widths) - 2 or final_activation:
            # in place: the linear layer's backward needs its input, never its output
            layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def linear_layer(fan_in: int, fan_out: int) -> nn.Linear:
    """nn.Linear, or a subclass with the same parameters whose GEMMs suit the input width."""
    if fan_in < NARROW_INPUT:
        return NarrowInputLinear(fan_in, fan_out)
    if fan_in % PAD_INPUT_TO:
        return PaddedInputLinear(fan_in, fan_out)
    return nn.Linear(fan_in, fan_out)


# Below this many input features (the 13 dense features of Criteo) the default layouts of
# nn.Linear's GEMMs are slow on CPU: measured at batch 2048, forward 0.95 -> 0.50 ms and weight
# gradient 1.42 -> 0.32 ms with the layouts of `_NarrowLinearFn`.
NARROW_INPUT = 16
# Wider inputs are zero-padded to a multiple of this many features (the dot interaction's 367 or
# 415 outputs): an odd reduction width slows the CPU's GEMMs, most of all the fp32 input gradient
# (one thread at batch 2048, 367 -> 368 wide: 13.0 -> 8.5 ms; all three GEMMs 32.2 -> 26.1 ms
# fp32, 12.0 -> 11.2 ms bf16), for the cost of copying the input once.
PAD_INPUT_TO = 8


def _apply_as_linear(fn, x, weight, bias, *args) -> torch.Tensor:
    """`fn.apply(x, weight, bias, *args)` with the operands autocast would give nn.Linear."""
    kind = x.device.type
    if not torch.is_autocast_enabled(kind):
        return fn.apply(x, weight, bias, *args)
    dtype = torch.get_autocast_dtype(kind)
    with torch.autocast(kind, enabled=False):
        return fn.apply(x.to(dtype), weight.to(dtype), bias.to(dtype), *args)


class _NarrowLinearFn(torch.autograd.Function):
    """y = x W^T + b with GEMM layouts that suit a small number of input features."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        return torch.addmm(bias, x, weight.t().contiguous())

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad_x = grad.mm(weight) if ctx.needs_input_grad[0] else None
        grad_w = x.t().mm(grad).t()  # [in, out], returned as a transposed view
        return grad_x, grad_w, grad.sum(0)


class NarrowInputLinear(nn.Linear):
    """nn.Linear (same parameters, same state dict) computed by `_NarrowLinearFn`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _apply_as_linear(_NarrowLinearFn, x, self.weight, self.bias)


class _PaddedLinearFn(torch.autograd.Function):
    """y = x W^T + b computed as [x, 0] [W, 0]^T + b, the reduction width padded to `width`."""

    @staticmethod
    def forward(ctx, x, weight, bias, width):  # type: ignore[override]
        ctx.fan_in = fan_in = x.shape[1]
        x_p, w_p = F.pad(x, (0, width - fan_in)), F.pad(weight, (0, width - fan_in))
        ctx.save_for_backward(x_p, w_p)
        return torch.addmm(bias, x_p, w_p.t())

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x_p, w_p = ctx.saved_tensors
        fan_in = ctx.fan_in
        grad_x = grad.mm(w_p)[:, :fan_in] if ctx.needs_input_grad[0] else None
        grad_w = grad.t().mm(x_p)[:, :fan_in]
        return grad_x, grad_w, grad.sum(0), None


class PaddedInputLinear(nn.Linear):
    """nn.Linear (same parameters, same state dict) computed by `_PaddedLinearFn`."""

    def padded_width(self) -> int:
        return -(-self.in_features // PAD_INPUT_TO) * PAD_INPUT_TO

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _apply_as_linear(_PaddedLinearFn, x, self.weight, self.bias, self.padded_width())


class _DotInteractionFn(torch.autograd.Function):
    """[x, z] where z holds the selected pairwise dot products of t = [x, e_1..e_k].

    The same arithmetic as autograd through bmm(t, t^T) and index_select, in cheaper layouts:
    forward multiplies with a contiguous t^T (bmm with a transposed view is 2-3x slower on
    CPU), and backward builds the symmetric gradient matrix G (G[i,j] = G[j,i] = dL/dz_ij) with
    one gather instead of zero-filling and scattering, so dL/dt = G t is a single bmm.
    """

    @staticmethod
    def forward(ctx, dense, sparse, pairs, grad_map, diagonal):  # type: ignore[override]
        batch, dim = dense.shape
        t = torch.cat([dense, sparse], dim=1).view(batch, -1, dim)
        t_t = t.transpose(1, 2).contiguous()
        z = torch.bmm(t_t.transpose(1, 2), t_t).flatten(1)
        ctx.save_for_backward(t, grad_map, diagonal)
        # gather, not index_select: index_select along dim 1 is 2-3x slower on CPU (bf16: 2.8x)
        return torch.cat([dense, torch.gather(z, 1, pairs.expand(batch, -1))], dim=1)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        t, grad_map, diagonal = ctx.saved_tensors
        batch, n, dim = t.shape
        grad_z = grad_out[:, dim:]
        # columns: 0 = zero (pairs not selected), 1.. = dL/dz, then 2 dL/dz_ii for the diagonal
        extended = torch.cat(
            [grad_z.new_zeros(batch, 1), grad_z, 2 * grad_z.index_select(1, diagonal)], dim=1
        )
        g = torch.gather(extended, 1, grad_map.expand(batch, -1)).view(batch, n, n)
        grad_t = torch.bmm(g, t).flatten(1)
        return grad_out[:, :dim] + grad_t[:, :dim], grad_t[:, dim:], None, None, None


class LowRankCrossNet(nn.Module):
    """DCNv2's low-rank cross layers (Wang et al. 2021), as torchrec's `LowRankCrossNet` (same
    parameter names and shapes, so weights copy across by name):

        x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l,   W_l [N, r], V_l [r, N], b_l [N]

    Initialised as torchrec does (Xavier-normal kernels, zero bias), from our generator.
    """

    def __init__(self, width: int, num_layers: int, rank: int, generator: torch.Generator) -> None:
        super().__init__()
        std = math.sqrt(2.0 / (width + rank))  # xavier_normal_ of either kernel

        def kernel(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape).normal_(0.0, std, generator=generator))

        self.W_kernels = nn.ParameterList(kernel(width, rank) for _ in range(num_layers))
        self.V_kernels = nn.ParameterList(kernel(rank, width) for _ in range(num_layers))
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(width)) for _ in range(num_layers))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """dense [B, D], sparse [B, k*D] -> [B, (k+1)*D], the cross net over [dense, sparse].

        Both in the kernels' dtype, as torchrec's concatenation promotes them under autocast
        (a bf16 bottom MLP's output, float32 pooled embeddings); bf16 serving hands a bf16 input
        to float32 kernels. The linears still run in bf16 under autocast."""
        dtype = self.bias[0].dtype
        x0 = torch.cat([dense.to(dtype), sparse.to(dtype)], dim=1)
        x = x0
        for w, v, b in zip(self.W_kernels, self.V_kernels, self.bias):
            x = x0 * (F.linear(F.linear(x, v), w) + b) + x
        return x


class Interaction(nn.Module):
    """`dot`: pairwise dot products of [x, e_1..e_k] (strict lower triangle, or with the diagonal
    when `itself`), concatenated after x.  `cat`: plain concatenation.  `dcn`: the low-rank
    cross net over the concatenation (`crossnet`, which `dcn` needs)."""

    def __init__(
        self, num_features: int, kind: str, itself: bool, crossnet: LowRankCrossNet | None = None
    ) -> None:
        super().__init__()
        self.kind = kind
        if kind == "dcn":
            if crossnet is None:
                raise ValueError("Interaction('dcn') needs its LowRankCrossNet")
            self.crossnet = crossnet
        offset = 1 if itself else 0
        pairs = [(i, j) for i in range(num_features) for j in range(i + offset)]
        flat = torch.tensor([i * num_features + j for i, j in pairs], dtype=torch.long)
        self.register_buffer("tril_flat", flat, persistent=False)
        # backward: where each entry of the symmetric gradient matrix comes from (see _DotInteractionFn)
        diagonal = [p for p, (i, j) in enumerate(pairs) if i == j]
        grad_map = torch.zeros(num_features, num_features, dtype=torch.long)
        for p, (i, j) in enumerate(pairs):
            grad_map[i, j] = grad_map[j, i] = 1 + p
        for d, p in enumerate(diagonal):
            grad_map[pairs[p][0], pairs[p][0]] = 1 + len(pairs) + d
        self.register_buffer("grad_map", grad_map.flatten(), persistent=False)
        self.register_buffer("diagonal", torch.tensor(diagonal, dtype=torch.long), persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """dense [B, D], sparse [B, k*D] (features side by side) -> [B, top input width]."""
        if self.kind == "dcn":
            return self.crossnet(dense, sparse)
        sparse = sparse.to(dense.dtype)
        if self.kind == "cat":
            return torch.cat([dense, sparse], dim=1)
        return _DotInteractionFn.apply(dense, sparse, self.tril_flat, self.grad_map, self.diagonal)


def make_interaction(
    num_features: int, dim: int, kind: str, itself: bool, dcn_num_layers: int,
    dcn_low_rank_dim: int, generator: torch.Generator,
) -> Interaction:  # fmt: skip
    """The interaction of num_features vectors of width dim; `dcn` draws its kernels from
    `generator` (dot and cat draw nothing, so their models initialise as before)."""
    crossnet = None
    if kind == "dcn":
        crossnet = LowRankCrossNet(num_features * dim, dcn_num_layers, dcn_low_rank_dim, generator)
    return Interaction(num_features, kind, itself, crossnet)


class DLRM(nn.Module):
    def __init__(self, arch: DLRMArch, embeddings: nn.Module, seed: int = 0) -> None:
        super().__init__()
        self.arch = arch
        gen = torch.Generator().manual_seed(seed)
        self.bottom_mlp = make_mlp(arch.bottom, final_activation=True, generator=gen)
        self.embeddings = embeddings
        self.interaction = make_interaction(
            arch.num_sparse + 1, arch.embedding_dim, arch.interaction, arch.interaction_itself,
            arch.dcn_num_layers, arch.dcn_low_rank_dim, gen,
        )  # fmt: skip
        self.top_mlp = make_mlp((arch.top_input, *arch.top), final_activation=False, generator=gen)

    def dense_parameters(self) -> list[nn.Parameter]:
        """What the dense optimizer steps; embedding rows are updated inside backward."""
        return [
            *self.bottom_mlp.parameters(),
            *self.interaction.parameters(),  # DCN's cross layers; none for dot and cat
            *self.top_mlp.parameters(),
        ]

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return self.dense_forward(dense, self.embeddings(sparse).values())

    def dense_forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Everything after the embedding lookup: what `--compile` compiles (dlrm/pipelines/compile.py)."""
        z = self.interaction(self.bottom_mlp(dense), pooled)
        return self.top_mlp(z).squeeze(1)


# --- the kind ------------------------------------------------------------------------------------


def arch_fields(cfg: Any, num_dense: int, num_sparse: int) -> dict[str, Any]:
    """DLRMArch's fields from the run's `arch` section (TBSM's step encoder has the same)."""
    a = cfg.arch
    return dict(
        num_dense=num_dense, embedding_dim=a.sparse_feature_size, num_sparse=num_sparse,
        bottom=a.mlp_bot, top=a.mlp_top, interaction=a.interaction_op,
        interaction_itself=a.interaction_itself, dcn_num_layers=a.dcn_num_layers,
        dcn_low_rank_dim=a.dcn_low_rank_dim,
    )  # fmt: skip


def arch_fields_from_signature(sig: dict, num_sparse: int) -> dict[str, Any]:
    """DLRMArch's fields from a checkpoint's `arch` (TrainConfig.arch_signature); the DCN ones
    only where the signature has them (dot and cat checkpoints from before DCN)."""
    bottom = tuple(sig["arch_mlp_bot"])
    return dict(
        num_dense=bottom[0], embedding_dim=int(sig["arch_sparse_feature_size"]),
        num_sparse=num_sparse, bottom=bottom, top=tuple(sig["arch_mlp_top"]),
        interaction=sig["arch_interaction_op"], interaction_itself=bool(sig["arch_interaction_itself"]),
        **{k: int(sig[k]) for k in ("dcn_num_layers", "dcn_low_rank_dim") if k in sig},
    )  # fmt: skip


KIND = ModelKind(
    name="dlrm",
    title="DLRM",
    arch_class=DLRMArch,
    model_class=DLRM,
    arch_from_settings=lambda cfg, num_dense, num_sparse: DLRMArch(
        **arch_fields(cfg, num_dense, num_sparse)
    ),
    arch_from_signature=lambda sig, num_sparse: DLRMArch(
        **arch_fields_from_signature(sig, num_sparse)
    ),
)
