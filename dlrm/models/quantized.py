"""The inference model: DLRM or TBSM around quantized tables, with int8, bf16 or fp32 MLPs.

One place builds it, whether from a trained model's float weights (export, and the trainer's
`--inference-only --quantize-*-with-bit` evaluation) or from an artifact's tensors (loading, in
hybrid_dlrm/serving/): the architecture, the tables' stored rows (`embeddings/quantized.py`) and the dense
tensors. It lives with the models, not with serving, because the trainer evaluates it and dlrm
never imports serving. The dense part at each precision:

- fp32: the trained layers as they are (`NarrowInputLinear` included);
- int8: every linear layer becomes torch's dynamically quantized `Linear` (int8 weights with one
  symmetric scale per output channel; activations quantized per batch). PyTorch's own
  `quantize_dynamic` swaps modules of the exact type `nn.Linear` only, and would silently leave the
  model's `NarrowInputLinear` layers (the 13-wide first bottom layer) in fp32: here every
  `nn.Linear` instance is swapped by module path, whatever its class;
- bf16: every linear layer keeps bf16 weights and computes in bf16 (oneDNN uses the CPU's bf16
  units where there are some). The bottom MLP hands bf16 to the interaction, which then runs in
  bf16 (the pooled embeddings cast to it) as under training's bf16 autocast: in float32 it cost
  this model a tenth of its bf16 speed (docs/inference.md). The last layer of every other MLP
  hands float32 on (the logit; TBSM's attention and LSTM read float32). On CPU each layer is
  oneDNN's linear with the ReLU after it fused (see `Bf16Linear`).

Inside `nn.MultiheadAttention` (TBSM `mha`) the projections are read as raw weights, not called
as modules, so they stay fp32, as do the LSTM (TBSM `rnn`) and TSL's attention matrices: the
per-layer precisions record it.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.ao.nn.quantized.dynamic as nnqd
import torch.nn.functional as F
from torch import nn

from dlrm.models.contract import RecModel
from dlrm.models.kinds import kind_of
from embeddings.collection import EmbeddingLookup
from embeddings.config import TableSpec
from embeddings.quantized import QuantizedEmbeddingBagCollection, quantize_rows

MLP_PRECISIONS = ("fp32", "bf16", "int8")


def _onednn_linear() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class Bf16Linear(nn.Module):
    """y = x W^T + b in bf16, then ReLU when `relu` (the ReLU that followed the layer, fused);
    `float_out`: the result as float32 (the last layer of an MLP that does not feed the
    interaction).

    On CPU the product is oneDNN's linear with the ReLU as its post-op
    (`torch.ops.mkldnn._linear_pointwise`, what TorchInductor lowers a linear layer to on CPU):
    the same bits as F.linear then ReLU (tested), and at batch 2048 on AVX512-BF16 a tenth less
    CPU time over the Kaggle MLP's layers (13-wide: 0.50 -> 0.28 ms; 367x512: 4.4 -> 4.0 ms)."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor, float_out: bool, relu: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().bfloat16(), requires_grad=False)
        self.bias = nn.Parameter(bias.detach().bfloat16(), requires_grad=False)
        self.float_out = float_out
        self.relu = relu
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self._packed: torch.Tensor | None = None  # the weight in oneDNN's blocked layout
        self._packed_from: tuple[int, int] | None = None

    def _onednn_weight(self) -> torch.Tensor:
        """The weight reordered once into oneDNN's blocked layout (what TorchInductor's
        weight prepacking does), redone if the weight changed (e.g. load_state_dict); passing the
        plain weight makes oneDNN reorder it on every call (2-3% of the layers' time)."""
        key = (self.weight.data_ptr(), self.weight._version)
        if self._packed_from != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
            self._packed_from = key
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        if x.device.type == "cpu" and _ONEDNN:
            post_op = "relu" if self.relu else "none"
            w = self._onednn_weight()
            y = torch.ops.mkldnn._linear_pointwise(x, w, self.bias, post_op, [], "")
        else:
            y = F.linear(x, self.weight, self.bias)
            if self.relu:
                y = torch.relu_(y)
        return y.float() if self.float_out else y


_ONEDNN = _onednn_linear()


def _int8_linear(weight: torch.Tensor, bias: torch.Tensor) -> nnqd.Linear:
    """torch's dynamic int8 Linear with per-output-channel symmetric weight scales."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch marks quantized tensors deprecated; still its API
        warnings.simplefilter("ignore")
        qweight = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
    return make_int8(qweight, bias)


def make_int8(qweight: torch.Tensor, bias: torch.Tensor) -> nnqd.Linear:
    out_features, in_features = qweight.shape
    q = nnqd.Linear(in_features, out_features, dtype=torch.qint8)
    q.set_weight_bias(qweight, bias.detach().float())
    return q


def _in_attention(path: str, model: nn.Module) -> bool:
    parts = path.split(".")
    return any(
        isinstance(model.get_submodule(".".join(parts[:i])), nn.MultiheadAttention)
        for i in range(1, len(parts))
    )


def linear_paths(model: nn.Module) -> list[str]:
    """Every linear layer a dense precision applies to (every `nn.Linear` instance, subclasses
    included, outside attention modules), by module path."""
    return [
        path
        for path, m in model.named_modules()
        if isinstance(m, nn.Linear) and not _in_attention(path, model)
    ]


def _ends_an_mlp(path: str, model: nn.Module) -> bool:
    """True when no linear layer follows `path` in its nn.Sequential (or it is in none)."""
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if not isinstance(parent, nn.Sequential):
        return True
    names = [n for n, _ in parent.named_children()]
    later = names[names.index(name) + 1 :]
    return not any(isinstance(parent.get_submodule(n), (nn.Linear, Bf16Linear)) for n in later)


def _relu_after(path: str, model: nn.Module) -> str | None:
    """The path of the nn.ReLU right after `path` in its nn.Sequential, if there is one."""
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if not isinstance(parent, nn.Sequential):
        return None
    names = [n for n, _ in parent.named_children()]
    i = names.index(name)
    if i + 1 < len(names) and isinstance(parent.get_submodule(names[i + 1]), nn.ReLU):
        return f"{parent_path}.{names[i + 1]}" if parent_path else names[i + 1]
    return None


def _feeds_the_interaction(path: str) -> bool:
    """A layer of a bottom MLP (DLRM's, or the step model's in TBSM): its output meets the pooled
    embeddings in the interaction, which computes in its dtype."""
    return path.rpartition(".")[0].rpartition(".")[2] == "bottom_mlp"


def set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, module)


def convert_dense(model: nn.Module, precision: str) -> dict[str, str]:
    """Swap every linear layer of `model` (in place) to `precision`; returns the precision of
    every layer with weights, by path (what the manifest and the numeric debugger list)."""
    if precision not in MLP_PRECISIONS:
        raise ValueError(f"unknown MLP precision {precision!r}: expected one of {MLP_PRECISIONS}")
    layers = {}
    for path in linear_paths(model):
        lin = model.get_submodule(path)
        if precision == "int8":
            set_module(model, path, _int8_linear(lin.weight, lin.bias))
        elif precision == "bf16":
            float_out = _ends_an_mlp(path, model) and not _feeds_the_interaction(path)
            relu = _relu_after(path, model)
            set_module(model, path, Bf16Linear(lin.weight, lin.bias, float_out, relu is not None))
            if relu is not None:  # fused into the layer
                set_module(model, relu, nn.Identity())
        layers[path] = precision
    for path, m in model.named_modules():  # what keeps float32 weights
        if isinstance(m, (nn.MultiheadAttention, nn.LSTM)):
            layers[path] = f"fp32 ({type(m).__name__} is not quantized)"
    for name, _ in model.named_parameters(recurse=True):
        owner = name.rpartition(".")[0]
        if not any(owner == k or owner.startswith(k + ".") for k in layers):
            layers[name] = "fp32 (not a linear layer)"
    return layers


# --- building ------------------------------------------------------------------------------------


def embedding_prefix(arch: Any) -> str:
    """Where the tables sit in the model's state dict."""
    return kind_of(arch).embedding_prefix


def build_model(
    arch: Any,
    tables: list[TableSpec],
    precisions: list[str],
    rows: list[torch.Tensor],
    device: torch.device | str = "cpu",
    backend: str = "auto",
    embeddings: EmbeddingLookup | None = None,
) -> RecModel:
    """The model around quantized tables (`embeddings`: a collection serving them already, e.g.
    from the SSD tier); its dense weights are still to be loaded."""
    emb = embeddings or QuantizedEmbeddingBagCollection(tables, precisions, rows, device, backend)
    with torch.no_grad():
        model = kind_of(arch).model_class(arch, emb, seed=0)
    return model.to(device).eval().requires_grad_(False)


def from_float_state(
    arch: Any,
    tables: list[TableSpec],
    state: dict[str, torch.Tensor],
    precisions: list[str],
    mlp_precision: str,
    device: torch.device | str = "cpu",
    backend: str = "auto",
) -> tuple[RecModel, dict[str, str]]:
    """A trained model's state dict -> the inference model at the given precisions, and its
    per-layer precisions."""
    prefix = embedding_prefix(arch)
    rows = [quantize_rows(state[f"{prefix}{t.name}.weight"], p) for t, p in zip(tables, precisions)]
    model = build_model(arch, tables, precisions, rows, device, backend)
    dense = {k: v for k, v in state.items() if not k.startswith(prefix)}
    _load_dense(model, dense)
    layers = convert_dense(model, mlp_precision)
    return model, layers


def _load_dense(model: nn.Module, dense: dict[str, torch.Tensor]) -> None:
    result = model.load_state_dict(dense, strict=False)
    emb = [k for k in result.missing_keys if ".embeddings." in f".{k}"]
    problems = [k for k in result.missing_keys if k not in emb] + list(result.unexpected_keys)
    if problems:
        raise KeyError(f"dense weights do not fit the model (keys {', '.join(problems[:4])})")


# --- the reference's flags ----------------------------------------------------------------------

EMB_BITS = {4: "int4", 8: "int8", 32: "fp32"}
# 16: bf16 here; the reference's 16 is torch's float16 dynamic quantization (fp16 weights,
# fp32 arithmetic), which bf16 replaces where the CPU has bf16 units (docs/inference.md)
MLP_BITS = {8: "int8", 16: "bf16", 32: "fp32"}


def quantize_for_evaluation(model: nn.Module, cfg) -> nn.Module:
    """`--inference-only --quantize-emb-with-bit B --quantize-mlp-with-bit B`: the trained model
    (any placement) as its quantized inference model, on the same device."""
    emb = model.embeddings
    emb.sync()
    device = next(iter(model.dense_parameters())).device
    tables = list(emb.tables)
    precision = EMB_BITS[cfg.run.quantize_emb_with_bit]
    state = model.state_dict()
    q, _ = from_float_state(model.arch, tables, state, [precision] * len(tables),
                            MLP_BITS[cfg.run.quantize_mlp_with_bit], device, cfg.arch.embedding_backend)  # fmt: skip
    return q
