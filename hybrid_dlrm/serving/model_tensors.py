"""The inference model as an artifact stores it: its architecture as JSON and its dense part as
plain tensors (int8 layers as codes, per-channel scales and zero points; bf16 layers as bf16),
and back. The model itself is built by `dlrm/models/quantized.py`.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict
from typing import Any

import torch
import torch.ao.nn.quantized.dynamic as nnqd
from torch import nn

from dlrm.models.kinds import kind_of, model_kind
from dlrm.models.quantized import make_int8, set_module
from embeddings.quantized import QuantizedEmbeddingBagCollection


def arch_to_json(arch: Any) -> dict:
    return {
        "model": kind_of(arch).name,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(arch).items()},
    }


def arch_from_json(data: dict) -> Any:
    """KeyError (an unknown kind too) or TypeError where `data` does not describe an arch."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "model"}
    return model_kind(data["model"]).arch_class(**fields)


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
        set_module(model, path, make_int8(qweight, bias))
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
