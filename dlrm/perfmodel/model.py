"""The fitted performance model: hardware description + kernel models + overhead statistics.

Saved as one JSON file (``perfmodel.json``): ``{"format": "hybrid-dlrm/perfmodel", "version": 1,
"hardware": {...}, "kernels": {...}, "overheads": {...}, "fit": {...}}``.
"""

from __future__ import annotations

import json
from pathlib import Path

from dlrm.perfmodel import critical_path, hardware
from dlrm.perfmodel import trace as tr
from dlrm.perfmodel.features import op_type
from dlrm.perfmodel.graph import (
    corrected_us,
    graph_for,
    least_disturbed_step,
    ops_with_ctx,
    records_from_trace,
)
from dlrm.perfmodel.kernels import KernelModels, gmae
from dlrm.perfmodel.microbench import read_records
from dlrm.perfmodel.overheads import Overheads

FORMAT = "hybrid-dlrm/perfmodel"
VERSION = 1


class ModelError(ValueError):
    """A missing or unreadable model file."""


def default_model_path() -> Path:
    return hardware.cache_dir() / f"perfmodel-{hardware.machine_key()}.json"


def calibrate_event_cost(
    docs: list[dict], kernels: KernelModels, measured_cost: float
) -> tuple[float, dict]:
    """The profiler's cost per event that makes the fit traces' predicted steps match their
    unprofiled (thread-CPU) step times: a 1-D search around the microbenchmarked cost. Without
    unprofiled times in the traces the microbenchmarked cost stands."""
    targets = [
        (d, d["meta"].get("unprofiled_step_cpu_us") or d["meta"].get("unprofiled_step_us"))
        for d in docs
    ]
    targets = [(d, t) for d, t in targets if t]
    if not targets:
        return measured_cost, {"method": "microbenchmark"}
    steps = [(ops_with_ctx(d, least_disturbed_step(d)), t) for d, t in targets]
    best = None
    hi = max(3.0 * measured_cost, 5.0)
    for i in range(41):
        c = hi * i / 40
        ov = Overheads.from_traces([d for d, _ in targets], event_cost=c)
        pred = [
            critical_path.traverse(ops, kernels.predict, ov.get, ov.step_end())["per_batch_us"]
            for ops, _ in steps
        ]
        err = gmae(pred, [t for _, t in steps])
        if best is None or err < best[0]:
            best = (err, c)
    return best[1], {"method": "fit traces vs unprofiled steps", "fit_gmae": best[0], "configs": len(steps),
                     "microbenchmarked_us": measured_cost}  # fmt: skip


class PerfModel:
    def __init__(
        self, hw: dict, kernels: KernelModels, overheads: Overheads, fit_info: dict | None = None
    ) -> None:
        self.hardware = hw
        self.kernels = kernels
        self.overheads = overheads
        self.fit_info = fit_info or {}

    # --- fitting ---------------------------------------------------------------------------

    @classmethod
    def fit(cls, bench_dir: str | Path, traces: list[str | Path] = (), seed: int = 0) -> PerfModel:
        bench_dir = Path(bench_dir)
        kfile = bench_dir / "kernels.jsonl"
        if not kfile.exists():
            raise ModelError(
                f"{kfile}: no microbenchmark records (run `python -m dlrm.perfmodel microbench` first)"
            )
        recs = read_records(kfile)
        trace_paths = tr.trace_files(
            [bench_dir / "traces", *traces] if (bench_dir / "traces").exists() else traces
        )
        docs = [tr.read_trace(p) for p in trace_paths]
        for d in docs:
            recs += records_from_trace(d)
        direct = any(r.get("sweep") == "gemm" for r in recs)
        # GEMMs from the direct thread-CPU sweep only, when there is one (see microbench)
        recs = [
            r
            for r in recs
            if not direct or op_type(r["name"]) not in ("gemm", "bmm") or r.get("sweep") == "gemm"
        ]
        for r in recs:
            r["dur_us"] = corrected_us(r)
        hw = hardware.describe()
        kernels = KernelModels().fit(recs, float(hw["llc_bytes"]), seed=seed)
        cost, calib = calibrate_event_cost(
            docs, kernels, float(hw.get("profiler_event_cost_us", 0.0))
        )
        overheads = Overheads.from_traces(docs, event_cost=cost)
        info = {"records": len(recs), "traces": [str(p) for p in trace_paths], "choice": kernels.choice,
                "heldout_gmae": {t: e["heldout_gmae"] for t, e in kernels.errors.items()},
                "event_cost_us": cost, "calibration": calib}  # fmt: skip
        return cls(hw, kernels, overheads, info)

    # --- files -----------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "version": VERSION, "hardware": self.hardware, "kernels": self.kernels.to_json(),
               "overheads": self.overheads.to_json(), "fit": self.fit_info}  # fmt: skip
        path.write_text(json.dumps(doc) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path | None = None) -> PerfModel:
        path = Path(path) if path else default_model_path()
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelError(
                f"{path}: no performance model (run `python -m dlrm.perfmodel microbench` and `fit`)"
            ) from None
        except json.JSONDecodeError as e:
            raise ModelError(f"{path}: not JSON ({e.msg})") from None
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ModelError(f"{path}: not a {FORMAT} v{VERSION} file")
        return cls(doc["hardware"], KernelModels.from_json(doc["kernels"]), Overheads.from_json(doc["overheads"]),
                   doc.get("fit"))  # fmt: skip

    # --- prediction ------------------------------------------------------------------------

    def predict_ops(self, ops: list[dict]) -> dict:
        return critical_path.traverse(
            ops, self.kernels.predict, self.overheads.get, self.overheads.step_end()
        )

    def predict(self, cfg, batch_size: int | None = None) -> dict:
        """Per-batch prediction; with FAE the hot- and cold-batch steps weighted by their share
        (``variants`` holds each)."""
        graphs, meta = graph_for(cfg, batch_size)
        variants = {}
        for kind, (weight, ops) in graphs.items():
            v = self.predict_ops(ops)
            v.update(weight=weight, ops=len(ops), kernels=sum(len(o["kernels"]) for o in ops))
            variants[kind] = v
        if len(variants) == 1:
            out = next(iter(variants.values()))
        else:
            out = _weighted(list(variants.values()))
            out["variants"] = variants
            out["hot_share"] = meta.get("hot_share")
        out["batch_size"] = meta["batch_size"]
        return out


def _weighted(results: list[dict]) -> dict:
    """Expectation of the numeric leaves of several predictions, by their `weight`."""

    def combine(values: list, weights: list[float]):
        if isinstance(values[0], dict):
            keys = set().union(*values)
            return {k: combine([v.get(k, 0.0) for v in values], weights) for k in keys}
        if isinstance(values[0], (int, float)):
            return sum(w * v for w, v in zip(weights, values))
        return values[0]

    weights = [r["weight"] for r in results]
    total = sum(weights) or 1.0
    return combine(
        [{k: v for k, v in r.items() if k != "weight"} for r in results],
        [w / total for w in weights],
    )
