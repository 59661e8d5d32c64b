"""`python -m hybrid_dlrm.serving.quantize --debug`: where quantization loses signal, table by table and layer by
layer, as the signal-to-quantization-noise ratio between the float and the quantized model's
outputs on the calibration batches:

    SQNR (dB) = 10 log10( sum(ref^2) / sum((ref - quantized)^2) )

Tables: each table's pooled embeddings. Layers: each linear layer's output (after its ReLU where
the quantized layer fuses it, as bf16 layers do), both models run on
the same batch end to end, so a layer's figure includes what earlier layers lost (what the
served model sees). The model's logits come last. Largest losses (lowest SQNR) first.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dlrm.models.quantized import linear_paths
from embeddings.kjt_ops import in_feature_order


class _Sums:
    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0

    def add(self, ref: torch.Tensor, q: torch.Tensor) -> None:
        ref, q = ref.double(), q.double()
        self.signal += float((ref * ref).sum())
        self.noise += float(((ref - q) ** 2).sum())

    def db(self) -> float:
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)


def _capture(model: nn.Module, paths: list[str], store: dict[str, torch.Tensor]) -> list:
    hooks = []
    for path in paths:

        def hook(_m, _inp, out, path=path):  # noqa: B023 (bound by the default argument)
            store[path] = out.detach().float()

        hooks.append(model.get_submodule(path).register_forward_hook(hook))
    return hooks


@torch.no_grad()
def sqnr_report(reference: nn.Module, quantized: nn.Module, batches) -> list[dict]:
    """Per table, per linear layer and for the logits: {"what", "name", "precision", "sqnr_db"},
    lowest SQNR first."""
    paths = linear_paths(reference)
    sums = {("layer", p): _Sums() for p in paths}
    emb_ref, emb_q = reference.embeddings, quantized.embeddings
    names = emb_q.feature_names
    for t in names:
        sums[("table", t)] = _Sums()
    sums[("model", "logits")] = _Sums()
    ref_out: dict[str, torch.Tensor] = {}
    q_out: dict[str, torch.Tensor] = {}
    hooks = _capture(reference, paths, ref_out) + _capture(quantized, paths, q_out)
    try:
        for b in batches.batches(0):
            kjt = in_feature_order(b.sparse_features, names)
            pr = emb_ref(kjt).to_dict()
            pq = emb_q(kjt).to_dict()
            for t in names:
                sums[("table", t)].add(pr[t], pq[t])
            lr = reference(b.dense_features, b.sparse_features)
            lq = quantized(b.dense_features, b.sparse_features)
            sums[("model", "logits")].add(lr, lq.float())
            for p in paths:
                ref = ref_out[p]
                if getattr(quantized.get_submodule(p), "relu", False):  # its ReLU fused (bf16)
                    ref = ref.clamp_min(0)
                sums[("layer", p)].add(ref, q_out[p])
    finally:
        for h in hooks:
            h.remove()
    precisions = dict(zip(names, emb_q.precisions))
    rows = []
    for (what, name), s in sums.items():
        if what == "table":
            precision = precisions[name]
        elif what == "layer":
            precision = _layer_precision(quantized.get_submodule(name))
        else:
            precision = ""
        rows.append({"what": what, "name": name, "precision": precision, "sqnr_db": s.db()})
    rows.sort(key=lambda r: r["sqnr_db"])
    return rows


def _layer_precision(m: nn.Module) -> str:
    kind = type(m).__name__
    if "quantized" in type(m).__module__:
        return "int8"
    if kind == "Bf16Linear":
        return "bf16"
    return "fp32"


def format_report(rows: list[dict]) -> str:
    lines = [f"{'SQNR dB':>9}  {'what':<6} {'precision':<9} name"]
    for r in rows:
        db = r["sqnr_db"]
        shown = "exact" if db == math.inf else f"{db:9.2f}"
        lines.append(f"{shown:>9}  {r['what']:<6} {r['precision']:<9} {r['name']}")
    return "\n".join(lines)
