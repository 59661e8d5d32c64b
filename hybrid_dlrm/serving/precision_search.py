"""`--emb-precision auto`: the cheapest precision per table under a normalized-entropy budget.

1. Sensitivity: on the calibration batches, one table at a time is quantized at each candidate
   precision (int2, int4, int8, fp16; every other table fp32, the MLPs fp32) and the model's NE
   measured: delta[t][p] = NE / NE_fp32 - 1.
2. Choice: every table starts at its cheapest precision; while the sum of the deltas (negative
   ones counted as 0) is over the budget, the table whose next more precise level buys the most
   NE per byte moves up one level (a greedy multiple-choice knapsack, assuming the deltas add).
3. Verification: the whole model at the chosen precisions (and at `--mlp-precision`) is
   measured; while its NE is over the budget, the worst table (largest delta at its current
   precision) backs off one level, and it is measured again.

Quantization is row-wise, so a table's calibration lookups only need the rows they touch: each
candidate quantizes and dequantises just those rows, and the model's dense part runs on pooled
embeddings assembled from the float ones with the candidate's columns replaced. That gives the
numbers the exported model gives (the same rows, the same sums), without quantizing gigabytes of
rows per candidate; the exported model is measured once more at the end.

Writes `sensitivity.json` (every delta, every step) and a PNG of model bytes vs NE change.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedTensor

from dlrm.metrics import binary_metrics
from dlrm.models.quantized import build_model, convert_dense, embedding_prefix, set_module
from embeddings.config import TableSpec
from embeddings.kjt_ops import in_feature_order
from embeddings.quantized import dequantize_rows, quantize_rows, table_bytes
from hybrid_dlrm.serving.model_tensors import model_bytes

log = logging.getLogger(__name__)

LEVELS = ("int2", "int4", "int8", "fp16", "fp32")  # cheapest first


class _GivenPooled(nn.Module):
    """Stands in for the embedding collection: returns the pooled embeddings it is given."""

    def __init__(self, names: list[str], dims: list[int]) -> None:
        super().__init__()
        self.names, self.dims = names, dims
        self.pooled: torch.Tensor | None = None

    def forward(self, features) -> KeyedTensor:
        return KeyedTensor(keys=self.names, length_per_key=self.dims, values=self.pooled)

    def sync(self) -> None:
        pass


def _set_embeddings(model: nn.Module, emb: nn.Module) -> None:
    set_module(model, embedding_prefix(model.arch).removesuffix("."), emb)


@dataclass
class _Lookups:
    """One table's calibration lookups: the rows touched, and per batch the positions of its
    ids among them and its bag offsets."""

    rows: torch.Tensor
    batches: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class Calibration:
    """Calibration batches with their float pooled embeddings, and a dense model (at an MLP
    precision) to score pooled embeddings with."""

    def __init__(self, arch, tables: list[TableSpec], state: dict, batches, mlp_precision: str):
        self.tables = tables
        self.names = [t.feature_name for t in tables]
        self.dims = [t.embedding_dim for t in tables]
        prefix = embedding_prefix(arch)
        self.weights = [state[f"{prefix}{t.name}.weight"] for t in tables]
        self.batches = batches.items
        self.labels = torch.cat([b.labels for b in self.batches])
        self.lookups = self._lookups()
        self.float_pooled = [
            torch.cat([self._pool(t, i, self.weights[t]) for t in range(len(tables))], dim=1)
            for i in range(len(self.batches))
        ]
        self.models = {p: self._dense_model(arch, state, p) for p in {"fp32", mlp_precision}}
        self.mlp_precision = mlp_precision
        self.reference_ne = self.ne({}, "fp32")

    def _lookups(self) -> list[_Lookups]:
        out = [_Lookups(torch.empty(0, dtype=torch.long)) for _ in self.tables]
        per_batch = []
        for b in self.batches:
            kjt = in_feature_order(b.sparse_features, self.names)
            n = kjt.stride()
            values, offsets = kjt.values().long(), kjt.offsets().long()
            per_batch.append([
                (values[offsets[t * n] : offsets[(t + 1) * n]], offsets[t * n : (t + 1) * n + 1])
                for t in range(len(self.tables))
            ])  # fmt: skip
        for t, lk in enumerate(out):
            lk.rows = torch.unique(torch.cat([pb[t][0] for pb in per_batch]))
            for pb in per_batch:
                ids, bags = pb[t]
                lk.batches.append((torch.searchsorted(lk.rows, ids), bags - bags[0]))
        return out

    def _pool(self, t: int, i: int, touched: torch.Tensor) -> torch.Tensor:
        """Table t's pooled embeddings in batch i; `touched`: the table's rows (all of them, or
        only those in `lookups[t].rows`, in that order)."""
        positions, bags = self.lookups[t].batches[i]
        if touched.shape[0] != self.lookups[t].rows.shape[0]:
            positions = self.lookups[t].rows[positions]
        return F.embedding_bag(positions, touched.float(), bags[:-1], mode="sum")

    def _dense_model(self, arch, state: dict, precision: str) -> nn.Module:
        one_row = [TableSpec(t.name, 1, t.embedding_dim, t.feature_name) for t in self.tables]
        rows = [torch.zeros(1, 4 * t.embedding_dim, dtype=torch.uint8) for t in self.tables]
        model = build_model(arch, one_row, ["fp32"] * len(one_row), rows, backend="torch")
        prefix = embedding_prefix(arch)
        model.load_state_dict({k: v for k, v in state.items() if not k.startswith(prefix)},
                              strict=False)  # fmt: skip
        convert_dense(model, precision)
        _set_embeddings(model, _GivenPooled(self.names, self.dims))
        return model

    def quantized_rows(self, t: int, precision: str) -> torch.Tensor:
        """Table t's touched rows after a round trip through `precision`."""
        rows = self.weights[t][self.lookups[t].rows]
        return dequantize_rows(quantize_rows(rows, precision), precision, self.dims[t])

    @torch.no_grad()
    def ne(self, precisions: dict[int, str], mlp_precision: str) -> float:
        """The model's NE with the tables in `precisions` quantized (the rest fp32)."""
        model = self.models[mlp_precision]
        emb = model.embeddings
        touched = {t: self.quantized_rows(t, p) for t, p in precisions.items() if p != "fp32"}
        starts = [0]
        for d in self.dims:
            starts.append(starts[-1] + d)
        logits = []
        for i, b in enumerate(self.batches):
            pooled = self.float_pooled[i]
            if touched:
                pooled = pooled.clone()
                for t, rows in touched.items():
                    pooled[:, starts[t] : starts[t + 1]] = self._pool(t, i, rows)
            emb.pooled = pooled
            logits.append(model(b.dense_features, b.sparse_features).float())
        return binary_metrics(torch.cat(logits), self.labels)["ne"]

    def relative(self, ne: float) -> float:
        return ne / self.reference_ne - 1.0


def _bytes(tables: list[TableSpec], choice: list[int]) -> int:
    return sum(
        table_bytes(t.num_embeddings, t.embedding_dim, LEVELS[c]) for t, c in zip(tables, choice)
    )


def search(cal: Calibration, budget: float, allowed: dict[int, tuple[str, ...]] | None = None,
           dense_bytes: int = 0) -> dict:  # fmt: skip
    """The choice per table and the record of how it was made (sensitivity.json).
    `allowed[t]`: the levels table t may take (a per-table override pins one)."""
    tables = cal.tables
    allowed = allowed or {}
    sens: list[dict[str, float]] = []
    # minutes on real tables: said as it goes, with what is left (a log has no bar)
    print(f"--emb-precision auto: each table's sensitivity at each precision ({len(tables)} "
          "tables)", file=sys.stderr, flush=True)  # fmt: skip
    started = time.perf_counter()
    for t, spec in enumerate(tables):
        levels = allowed.get(t, LEVELS)
        sens.append({p: (cal.relative(cal.ne({t: p}, "fp32")) if p != "fp32" else 0.0)
                     for p in levels})  # fmt: skip
        log.info("sensitivity %s: %s", spec.feature_name, sens[-1])
        spent = time.perf_counter() - started
        left = spent / (t + 1) * (len(tables) - t - 1)
        print(f"  {t + 1}/{len(tables)} {spec.feature_name}: {spent:.0f} s, about {left:.0f} s "
              "left", file=sys.stderr, flush=True)  # fmt: skip
    levels_of = [[LEVELS.index(p) for p in allowed.get(t, LEVELS)] for t in range(len(tables))]
    choice = [lv[0] for lv in levels_of]

    def pred(t: int, level: int) -> float:
        return max(sens[t][LEVELS[level]], 0.0)

    def up(t: int) -> int | None:
        later = [lv for lv in levels_of[t] if lv > choice[t]]
        return later[0] if later else None

    path = []
    while sum(pred(t, c) for t, c in enumerate(choice)) > budget:
        best, best_gain = None, -1.0
        for t in range(len(tables)):
            nxt = up(t)
            if nxt is None:
                continue
            saved = pred(t, choice[t]) - pred(t, nxt)
            cost = _bytes([tables[t]], [nxt]) - _bytes([tables[t]], [choice[t]])
            gain = saved / max(cost, 1)
            if gain > best_gain:
                best, best_gain = t, gain
        if best is None:
            break
        choice[best] = up(best)
        path.append({"table": tables[best].feature_name, "to": LEVELS[choice[best]],
                     "predicted_ne_change": sum(pred(t, c) for t, c in enumerate(choice)),
                     "table_bytes": _bytes(tables, choice)})  # fmt: skip
    steps = []
    while True:
        measured = cal.relative(
            cal.ne({t: LEVELS[c] for t, c in enumerate(choice)}, cal.mlp_precision)
        )
        steps.append({"choice": {tables[t].feature_name: LEVELS[c] for t, c in enumerate(choice)},
                      "ne_change": measured, "table_bytes": _bytes(tables, choice)})  # fmt: skip
        if measured <= budget:
            break
        movable = [t for t in range(len(tables)) if up(t) is not None]
        if not movable:
            log.warning("NE over budget (%.4g > %.4g) even with every table as precise as allowed: "
                        "the MLP precision alone costs that much", measured, budget)  # fmt: skip
            break
        worst = max(movable, key=lambda t: (sens[t][LEVELS[choice[t]]], tables[t].num_embeddings))
        choice[worst] = up(worst)
        steps[-1]["backed_off"] = tables[worst].feature_name
    uniform = {}
    for p in LEVELS:
        if all(p in allowed.get(t, LEVELS) for t in range(len(tables))):
            cfg = {t: p for t in range(len(tables))}
            uniform[p] = {"ne_change": cal.relative(cal.ne(cfg, cal.mlp_precision)),
                          "table_bytes": _bytes(tables, [LEVELS.index(p)] * len(tables))}  # fmt: skip
    return {
        "budget": budget,
        "reference_ne": cal.reference_ne,
        "calibration_samples": int(cal.labels.numel()),
        "mlp_precision": cal.mlp_precision,
        "dense_bytes": dense_bytes,
        "fp32_table_bytes": _bytes(tables, [LEVELS.index("fp32")] * len(tables)),
        "sensitivity": {
            spec.feature_name: {
                "rows": spec.num_embeddings,
                "dim": spec.embedding_dim,
                "ne_change": sens[t],
                "bytes": {
                    p: table_bytes(spec.num_embeddings, spec.embedding_dim, p) for p in sens[t]
                },
            }  # fmt: skip
            for t, spec in enumerate(tables)
        },
        "greedy_path": path,
        "verification": steps,
        "uniform": uniform,
        "choice": {tables[t].feature_name: LEVELS[c] for t, c in enumerate(choice)},
        "within_budget": steps[-1]["ne_change"] <= budget,
    }


def plot(record: dict, path: Path) -> None:
    """Model bytes vs NE change: uniform precisions, the greedy path and the verified choice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dense = record["dense_bytes"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    uni = record["uniform"]
    ax.scatter([u["table_bytes"] + dense for u in uni.values()],
               [100 * u["ne_change"] for u in uni.values()], marker="s", label="every table at")  # fmt: skip
    for p, u in uni.items():
        ax.annotate(p, (u["table_bytes"] + dense, 100 * u["ne_change"]), fontsize=8)
    if record["greedy_path"]:
        g = record["greedy_path"]
        ax.plot([s["table_bytes"] + dense for s in g], [100 * s["predicted_ne_change"] for s in g],
                ".-", alpha=0.5, label="greedy choice (predicted)")  # fmt: skip
    v = record["verification"]
    ax.plot([s["table_bytes"] + dense for s in v], [100 * s["ne_change"] for s in v], "o-",
            color="C3", label="whole model measured")  # fmt: skip
    ax.axhline(100 * record["budget"], color="gray", ls="--", label="budget")
    ax.set_xscale("log")
    ax.set_xlabel("model bytes")
    ax.set_ylabel("NE change vs fp32 (%)")
    ax.set_title(f"precision search ({record['mlp_precision']} MLPs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fp32_model_bytes(tables: list[TableSpec], state: dict, arch) -> int:
    """Bytes of the float model: tables and dense weights at fp32."""
    prefix = embedding_prefix(arch)
    dense = sum(v.numel() * v.element_size() for k, v in state.items() if not k.startswith(prefix))
    return _bytes(tables, [LEVELS.index("fp32")] * len(tables)) + dense


__all__ = ["Calibration", "LEVELS", "fp32_model_bytes", "model_bytes", "plot", "search"]
