"""The inference model: DLRM or TBSM around quantized tables, with int8, bf16 or fp32 MLPs.

One place builds it, whether from a trained model's float weights (export) or from an
artifact's tensors (loading): the architecture, the tables' stored rows (`embeddings/quantized.py`)
and the dense tensors. The dense part at each precision:

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
from dataclasses import asdict

import torch
import torch.ao.nn.quantized.dynamic as nnqd
import torch.nn.functional as F
from torch import nn

from dlrm.models.dlrm import DLRM, DLRMArch
from dlrm.models.tbsm import TBSM, TBSMArch
from embeddings.collection import EmbeddingCollection
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
    return _make_int8(qweight, bias)


def _make_int8(qweight: torch.Tensor, bias: torch.Tensor) -> nnqd.Linear:
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


def _set(model: nn.Module, path: str, module: nn.Module) -> None:
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
            _set(model, path, _int8_linear(lin.weight, lin.bias))
        elif precision == "bf16":
            float_out = _ends_an_mlp(path, model) and not _feeds_the_interaction(path)
            relu = _relu_after(path, model)
            _set(model, path, Bf16Linear(lin.weight, lin.bias, float_out, relu is not None))
            if relu is not None:  # fused into the layer
                _set(model, relu, nn.Identity())
        layers[path] = precision
    for path, m in model.named_modules():  # what keeps float32 weights
        if isinstance(m, (nn.MultiheadAttention, nn.LSTM)):
            layers[path] = f"fp32 ({type(m).__name__} is not quantized)"
    for name, _ in model.named_parameters(recurse=True):
        owner = name.rpartition(".")[0]
        if not any(owner == k or owner.startswith(k + ".") for k in layers):
            layers[name] = "fp32 (not a linear layer)"
    return layers


# --- architecture ------------------------------------------------------------------------------


def arch_to_json(arch: DLRMArch | TBSMArch) -> dict:
    kind = "tbsm" if isinstance(arch, TBSMArch) else "dlrm"
    return {
        "model": kind,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(arch).items()},
    }


def arch_from_json(data: dict) -> DLRMArch | TBSMArch:
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "model"}
    return TBSMArch(**fields) if data["model"] == "tbsm" else DLRMArch(**fields)


def embedding_prefix(arch: DLRMArch | TBSMArch) -> str:
    """Where the tables sit in the model's state dict."""
    return "step.embeddings." if isinstance(arch, TBSMArch) else "embeddings."


# --- building ------------------------------------------------------------------------------------


def build_model(
    arch: DLRMArch | TBSMArch,
    tables: list[TableSpec],
    precisions: list[str],
    rows: list[torch.Tensor],
    device: torch.device | str = "cpu",
    backend: str = "auto",
    embeddings: EmbeddingCollection | None = None,
) -> DLRM | TBSM:
    """The model around quantized tables (`embeddings`: a collection serving them already, e.g.
    from the SSD tier); its dense weights are still to be loaded."""
    emb = embeddings or QuantizedEmbeddingBagCollection(tables, precisions, rows, device, backend)
    model_class = TBSM if isinstance(arch, TBSMArch) else DLRM
    with torch.no_grad():
        model = model_class(arch, emb, seed=0)
    return model.to(device).eval().requires_grad_(False)


def from_float_state(
    arch: DLRMArch | TBSMArch,
    tables: list[TableSpec],
    state: dict[str, torch.Tensor],
    precisions: list[str],
    mlp_precision: str,
    device: torch.device | str = "cpu",
    backend: str = "auto",
) -> tuple[DLRM | TBSM, dict[str, str]]:
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


def _int8_paths(model: nn.Module) -> list[str]:
    return [path for path, m in model.named_modules() if isinstance(m, nnqd.Linear)]


def _dense_state(model: nn.Module, skip: list[str]) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers outside the tables and the `skip` modules (the state
    dict would dequantise every table only to drop it)."""
    out = {}
    for path, m in model.named_modules():
        if isinstance(m, QuantizedEmbeddingBagCollection) or any(
            path == s or path.startswith(s + ".") for s in skip
        ):
            continue
        prefix = f"{path}." if path else ""
        for name, t in m._parameters.items():
            if t is not None:
                out[prefix + name] = t.detach()
        for name, t in m._buffers.items():
            if t is not None and name not in m._non_persistent_buffers_set:
                out[prefix + name] = t.detach()
    return out


def dense_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The dense part as plain tensors (what an artifact stores): int8 layers as their codes,
    per-channel scales and zero points; bf16 layers as bf16; everything else as in the state
    dict. `load_dense_tensors` reverses it."""
    int8 = _int8_paths(model)
    out: dict[str, torch.Tensor] = {}
    for path in int8:
        m = model.get_submodule(path)
        w, b = m.weight(), m.bias()
        out[f"{path}.weight.int8"] = w.int_repr()
        out[f"{path}.weight.scale"] = w.q_per_channel_scales()
        out[f"{path}.weight.zero_point"] = w.q_per_channel_zero_points()
        out[f"{path}.bias"] = b.detach()
    out.update(_dense_state(model, int8))
    return out


def load_dense_tensors(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Set the dense weights of a model already converted to its precision (`convert_dense`);
    KeyError naming what does not fit."""
    tensors = dict(tensors)
    int8 = _int8_paths(model)
    for path in int8:
        m = model.get_submodule(path)
        keys = [f"{path}.weight.{s}" for s in ("int8", "scale", "zero_point")] + [f"{path}.bias"]
        missing = [k for k in keys if k not in tensors]
        if missing:
            raise KeyError(f"dense weights do not fit the model (keys {', '.join(missing)})")
        codes, scale, zero, bias = (tensors.pop(k) for k in keys)
        shape = tuple(m.weight().shape)
        if tuple(codes.shape) != shape or scale.shape != (shape[0],) or zero.shape != (shape[0],):
            raise KeyError(f"{keys[0]}: shape {tuple(codes.shape)}, expected {shape}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(
                codes.to(torch.int8), scale.double(), zero.long(), 0
            )
        _set(model, path, _make_int8(qweight, bias))
    mine = _dense_state(model, int8)
    problems = sorted(set(mine) ^ set(tensors))
    if problems:
        raise KeyError(f"dense weights do not fit the model (keys {', '.join(problems[:4])})")
    with torch.no_grad():
        for k, dst in mine.items():
            src = tensors[k]
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise KeyError(
                    f"{k}: {src.dtype} {tuple(src.shape)}, expected {dst.dtype} {tuple(dst.shape)}"
                )
            dst.copy_(src)


def model_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the tables (as stored) and of the dense part (as `dense_tensors` stores it)."""
    tables = sum(r.numel() for r in model.embeddings.table_rows())
    dense = sum(t.numel() * t.element_size() for t in dense_tensors(model).values())
    return {"table_bytes": tables, "dense_bytes": dense, "model_bytes": tables + dense}


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
    precision = EMB_BITS[cfg.quantize_emb_with_bit]
    state = model.state_dict()
    q, _ = from_float_state(model.arch, tables, state, [precision] * len(tables),
                            MLP_BITS[cfg.quantize_mlp_with_bit], device, cfg.embedding_backend)  # fmt: skip
    return q
