"""TBSM (Ishkhanov et al. 2020): a DLRM step encoder over a user's history and a time-series
layer (TSL) that attends from the candidate to the history, then an MLP gives the logit.

Per step j = 0..T (T history events, then the candidate), the step encoder is the DLRM embedding
layer: bottom MLP over the dense position feature, the embedding collection over the step's ids,
the dot (or cat, or DCN) interaction and a top MLP whose output z_j (width m = top[-1]) has no final
activation. All B*(T+1) steps of a batch go through it in one call (the batch's KJT already has
batch dimension B*(T+1), see data_pipeline/taobao_dataset.py); the result is viewed as
[B, T+1, m]: H = z_0..z_{T-1}, w = z_T.

`tsl` (per head; heads are independent TSL + MLP pairs, combined by a final MLP over their
logits, as the reference does):
    x = w (`dot`), A w (`ind`) or A^T A w (`def`), A an m x m parameter
    a = H x                                   scores [B, T]
    `mul`: c = 1/T sum_t a_t H_t;  `mlp`: c = 1/T sum_t y_t H_t with y = sigmoid(MLP(a)),
    MLP T->...->T
    logit = MLP([c, w])
  with `proj`, H and w are first projected onto the unit sphere (L2), as the reference does.

Unlike the reference, the context is the weighted *mean* of the history, not its sum. The sum of
T unit vectors weighted by sigmoids in (0, 1) is about T/2 long, an order of magnitude longer than
w beside it in [c, w]; under Adagrad, whose first steps move every weight by about the learning
rate whatever its gradient, the final MLP's pre-activations then swung by ~T/2 times the scale
the rest of the model trains at, most of its ReLUs died, and on the data.md sample 1 of 10 seeds
(the default among them) ended at chance while DLRM learned (docs/measurements/tbsm.md).
`mha`: c = MultiheadAttention(query = Q w, keys = values = H), Q: m -> heads*m;
    logit = MLP([c, w]).
`rnn`: c = the last layer's final hidden state of an LSTM over H; logit = MLP([c, w]).

Unlike the reference, the attention and LSTM modules are created once here, so they train, and
the LSTM starts from zero states (the reference draws random ones on every call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from dlrm.errors import ArchError
from dlrm.models.dlrm import (
    INTERACTIONS,
    arch_fields,
    arch_fields_from_signature,
    check_bottom_mlp,
    check_dcn,
    interaction_width,
    make_interaction,
    make_mlp,
)
from dlrm.models.kinds import ModelKind

if TYPE_CHECKING:  # torchrec costs seconds to import: serving raw lines needs no KJT
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

MODEL_TYPES = ("tsl", "mha", "rnn")
TSL_INNER = ("dot", "ind", "def")
TSL_MECHANISMS = ("mul", "mlp")


@dataclass(frozen=True)
class TBSMArch:
    """Widths as in the reference's flags: `bottom` includes the dense input width; `top`,
    `tsl_mlp` and `arch_mlp` exclude their input width, which follows from the rest."""

    num_dense: int
    embedding_dim: int
    num_sparse: int
    bottom: tuple[int, ...]  # e.g. (1, 16)
    top: tuple[int, ...]  # e.g. (15, 15): z has width top[-1]
    ts_length: int = 20
    model_type: str = "tsl"
    tsl_inner: str = "def"
    tsl_mechanism: str = "mlp"
    tsl_num_heads: int = 1
    tsl_mlp: tuple[int, ...] = (15, 15)  # hidden widths of the attention MLP (T -> ... -> T)
    arch_mlp: tuple[int, ...] = (60, 1)  # the final MLP after [c, w], ending in 1
    tsl_proj: bool = True
    mha_num_heads: int = 8
    rnn_num_layers: int = 1
    interaction: str = "dot"
    interaction_itself: bool = False
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 512

    def __post_init__(self) -> None:
        def choice(field: str, options: tuple[str, ...]) -> None:
            value = getattr(self, field)
            if value not in options:
                raise ArchError(field, f"expected one of {', '.join(options)}, got {value!r}")

        choice("model_type", MODEL_TYPES)
        choice("tsl_inner", TSL_INNER)
        choice("tsl_mechanism", TSL_MECHANISMS)
        choice("interaction", INTERACTIONS)
        check_dcn(self.dcn_num_layers, self.dcn_low_rank_dim)
        check_bottom_mlp(self.bottom, self.num_dense, self.embedding_dim)
        if not self.top:
            raise ArchError("top", "needs at least one width")
        if not self.arch_mlp or self.arch_mlp[-1] != 1:
            raise ArchError(
                "arch_mlp",
                f"last width must be 1 (one logit), got {'-'.join(map(str, self.arch_mlp))}",
            )
        for field in ("ts_length", "tsl_num_heads", "mha_num_heads", "rnn_num_layers"):
            if getattr(self, field) < 1:
                raise ArchError(field, f"expected a positive integer, got {getattr(self, field)}")

    @property
    def step_dim(self) -> int:
        return self.top[-1]

    @property
    def context_dim(self) -> int:
        return self.mha_num_heads * self.step_dim if self.model_type == "mha" else self.step_dim


class StepEncoder(nn.Module):
    """The DLRM embedding layer of one time step, without a final activation."""

    def __init__(self, arch: TBSMArch, embeddings: nn.Module, gen: torch.Generator) -> None:
        super().__init__()
        self.bottom_mlp = make_mlp(arch.bottom, final_activation=True, generator=gen)
        self.embeddings = embeddings
        n = arch.num_sparse + 1
        self.interaction = make_interaction(
            n, arch.embedding_dim, arch.interaction, arch.interaction_itself,
            arch.dcn_num_layers, arch.dcn_low_rank_dim, gen,
        )  # fmt: skip
        width = interaction_width(n, arch.embedding_dim, arch.interaction, arch.interaction_itself)
        self.top_mlp = make_mlp((width, *arch.top), final_activation=False, generator=gen)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        return self.dense_forward(dense, self.embeddings(sparse).values())

    def dense_forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.top_mlp(self.interaction(self.bottom_mlp(dense), pooled))


class TSLHead(nn.Module):
    """One time-series layer: attention from the (transformed) candidate over the history."""

    def __init__(self, arch: TBSMArch, gen: torch.Generator) -> None:
        super().__init__()
        self.inner, self.mechanism = arch.tsl_inner, arch.tsl_mechanism
        m = arch.step_dim
        if self.inner in ("ind", "def"):
            self.A = nn.Parameter(torch.empty(m, m).normal_(0.0, math.sqrt(1.0 / m), generator=gen))
        if self.mechanism == "mlp":
            # sigmoid on the last layer: attention weights in (0, 1), as the reference has them
            T = arch.ts_length
            self.attention_mlp = nn.Sequential(
                *make_mlp((T, *arch.tsl_mlp, T), final_activation=False, generator=gen),
                nn.Sigmoid(),
            )

    def forward(self, w: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
        """w [B, m], H [B, T, m] -> context [B, m]."""
        if self.inner == "ind":
            x = w @ self.A.T  # A w
        elif self.inner == "def":
            x = (w @ self.A.T) @ self.A  # A^T A w
        else:
            x = w
        a = torch.bmm(H, x.unsqueeze(2)).squeeze(2)  # [B, T]
        if self.mechanism == "mlp":
            a = self.attention_mlp(a)
        # the mean, not the reference's sum: the context keeps w's scale (see the docstring)
        return torch.bmm(a.unsqueeze(1), H).squeeze(1) / H.shape[1]


class TBSM(nn.Module):
    def __init__(self, arch: TBSMArch, embeddings: nn.Module, seed: int = 0) -> None:
        super().__init__()
        self.arch = arch
        gen = torch.Generator().manual_seed(seed)
        self.step = StepEncoder(arch, embeddings, gen)
        m, heads = arch.step_dim, arch.tsl_num_heads
        final_in = arch.context_dim + m
        if arch.model_type == "tsl":
            self.heads = nn.ModuleList(TSLHead(arch, gen) for _ in range(heads))
            self.head_mlps = nn.ModuleList(
                make_mlp((final_in, *arch.arch_mlp), final_activation=False, generator=gen)
                for _ in range(heads)
            )
            if heads > 1:
                self.combine = make_mlp(
                    (heads, heads + 4, 1), final_activation=False, generator=gen
                )
        else:
            # torch's own initialisation of these modules, from this model's seed
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                if arch.model_type == "mha":
                    self.query = nn.Linear(m, arch.context_dim)
                    self.attention = nn.MultiheadAttention(
                        arch.context_dim, arch.mha_num_heads, kdim=m, vdim=m, batch_first=True
                    )
                else:
                    self.lstm = nn.LSTM(m, m, arch.rnn_num_layers, batch_first=True)
            self.head_mlps = nn.ModuleList(
                [make_mlp((final_in, *arch.arch_mlp), final_activation=False, generator=gen)]
            )

    @property
    def embeddings(self) -> nn.Module:
        return self.step.embeddings

    def dense_parameters(self) -> list[nn.Parameter]:
        """Everything but the embedding rows (which are updated inside backward)."""
        return list(self.parameters())

    def encode_steps(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """[B, T+1, m]: the step encoder on all B*(T+1) steps in one call."""
        z = self.step(dense, sparse)
        return z.view(-1, self.arch.ts_length + 1, z.shape[-1])

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        T = self.arch.ts_length
        if dense.shape[0] % (T + 1):
            raise ValueError(
                f"TBSM: {dense.shape[0]} steps is not a multiple of ts_length + 1 = {T + 1}"
            )
        return self.dense_forward(dense, self.embeddings(sparse).values())

    def dense_forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Everything after the embedding lookup: what `--compile` compiles (dlrm/pipelines/compile.py)."""
        T = self.arch.ts_length
        z = self.step.dense_forward(dense, pooled)
        z = z.view(-1, T + 1, z.shape[-1])
        H, w = z[:, :T], z[:, T]
        kind = self.arch.model_type
        if kind == "tsl":
            if self.arch.tsl_proj:
                H, w = F.normalize(H, p=2, dim=2), F.normalize(w, p=2, dim=1)
            logits = torch.cat(
                [
                    mlp(torch.cat([head(w, H), w], dim=1))
                    for head, mlp in zip(self.heads, self.head_mlps)
                ],
                dim=1,
            )
            out = self.combine(logits) if len(self.heads) > 1 else logits
        elif kind == "mha":
            c, _ = self.attention(self.query(w).unsqueeze(1), H, H, need_weights=False)
            out = self.head_mlps[0](torch.cat([c.squeeze(1), w], dim=1))
        else:
            _, (h, _) = self.lstm(H)
            out = self.head_mlps[0](torch.cat([h[-1], w], dim=1))
        return out.squeeze(1)


# --- the kind ------------------------------------------------------------------------------------

# TBSMArch's own fields, named as their settings (so a checkpoint's signature holds them as is)
SIGNATURE_FIELDS = ("ts_length", "model_type", "tsl_inner", "tsl_mechanism", "tsl_num_heads",
                    "tsl_mlp", "arch_mlp", "tsl_proj", "mha_num_heads", "rnn_num_layers")  # fmt: skip


def _arch_from_settings(cfg: Any, num_dense: int, num_sparse: int) -> TBSMArch:
    own = {k: getattr(cfg.tbsm, k) for k in SIGNATURE_FIELDS}
    return TBSMArch(**arch_fields(cfg, num_dense, num_sparse), **own)


def _arch_from_signature(sig: dict, num_sparse: int) -> TBSMArch:
    own = {k: tuple(sig[k]) if isinstance(sig[k], list) else sig[k] for k in SIGNATURE_FIELDS}
    return TBSMArch(**arch_fields_from_signature(sig, num_sparse), **own)


KIND = ModelKind(
    name="tbsm",
    title="TBSM",
    arch_class=TBSMArch,
    model_class=TBSM,
    arch_from_settings=_arch_from_settings,
    arch_from_signature=_arch_from_signature,
    signature_fields=SIGNATURE_FIELDS,
    layout="sequence",
    rows_per_sample=lambda cfg: cfg.tbsm.ts_length + 1,
    embedding_prefix="step.embeddings.",
)
