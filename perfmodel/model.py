"""The fitted performance model: hardware description + kernel models + overhead statistics.

Saved as one JSON file (``perfmodel.json``): ``{"format": "hybrid-perfmodel", "version": 1,
"hardware": {...}, "kernels": {...}, "overheads": {...}, "fit": {...}}``.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from hybrid_dlrm.common.header import check_header
from perfmodel import critical_path, hardware
from perfmodel import trace as tr
from perfmodel.errors import CalibrationOff, ModelError
from perfmodel.features import op_type, step_dense_bytes
from perfmodel.graph import (
    corrected_us,
    graph_for,
    records_from_trace,
)
from perfmodel.kernels import KernelModels
from perfmodel.microbench import read_records
from perfmodel.overheads import Overheads
from perfmodel.sweeps import at_described_speed

FORMAT = "hybrid-perfmodel"
VERSION = 1


def default_model_path() -> Path:
    return hardware.cache_dir() / f"perfmodel-{hardware.machine_key()}.json"


def event_cost_check(docs: list[dict], measured_cost: float) -> dict:
    """The microbenchmarked profiler cost per event next to what the fit traces imply
    ((profiled - plain step) thread-CPU time / events): a consistency check, reported by `fit`;
    the microbenchmarked figure is the one used (per-step differences are too noisy on a shared
    machine to fit anything to)."""
    implied = []
    for d in docs:
        plain = d["meta"].get("unprofiled_step_cpu_us")
        steps = [s for s in d["steps"] if s.get("cpu_us")]
        if plain and steps:
            prof = statistics.median(s["cpu_us"] for s in steps)
            events = statistics.median(
                sum(o.get("n_events", 1) for o in s["ops"]) + 2 for s in steps
            )
            implied.append((prof - plain) / events)
    return {"used_us": measured_cost, "implied_by_fit_traces_us": implied}


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
        kfiles = sorted(bench_dir.glob("kernels*.jsonl"))
        if not kfiles:
            raise ModelError(
                f"{bench_dir}: no microbenchmark records (run `python -m perfmodel microbench` first)"
            )
        recs = [r for f in kfiles for r in read_records(f)]
        trace_paths = tr.trace_files(
            [bench_dir / "traces", *traces] if (bench_dir / "traces").exists() else traces
        )
        docs = [tr.read_trace(p) for p in trace_paths]
        model = cls.from_measurements(recs, docs, hardware.describe(), seed)
        model.fit_info["traces"] = [str(p) for p in trace_paths]
        return model

    @classmethod
    def from_measurements(
        cls, recs: list[dict], docs: list[dict], hw: dict, seed: int = 0, gemm_mlp: bool = True
    ) -> PerfModel:
        """The fit itself, from microbenchmark kernel records and perf-trace documents: the full
        microbenchmark's (`fit`) and the quick calibration's at a run's own shapes
        (perfmodel/calibration.py, with `gemm_mlp` False: see `KernelModels.fit`) are one model
        form."""
        recs = list(recs)
        for d in docs:
            recs += records_from_trace(d)
        direct = any(r.get("sweep") == "gemm" for r in recs)
        # GEMMs from the direct thread-CPU sweep only, when there is one (see perfmodel.sweeps)
        recs = [
            r
            for r in recs
            if not direct or op_type(r["name"]) not in ("gemm", "bmm") or r.get("sweep") == "gemm"
        ]
        for r in recs:
            r["dur_us"] = at_described_speed(r, corrected_us(r))
        l2 = float((hw.get("cache_bytes_os") or {}).get("L2") or (1 << 20))
        kernels = KernelModels().fit(recs, float(hw["llc_bytes"]), seed=seed, l2_bytes=l2,
                                     device_l2_bytes=hw.get("cuda_l2_bytes"), gemm_mlp=gemm_mlp)  # fmt: skip
        slowdowns = [d["meta"].get("machine_slowdown") for d in docs]
        in_situ = kernels.calibrate_in_situ(
            [[dict(r, dur_us=corrected_us(r)) for r in records_from_trace(d)] for d in docs],
            slowdowns,
        )
        cost = float(hw.get("profiler_event_cost_us", 0.0))
        calib = event_cost_check(docs, cost)
        overheads = Overheads.from_traces(docs, event_cost=cost)
        info = {"records": len(recs), "traces": [], "choice": kernels.choice,
                "heldout_gmae": {t: e["heldout_gmae"] for t, e in kernels.errors.items()},
                "event_cost_us": cost, "calibration": calib, "in_situ": in_situ,
                "trace_slowdowns": slowdowns}  # fmt: skip
        return cls(hw, kernels, overheads, info)

    # --- files -----------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "hardware": self.hardware, "kernels": self.kernels.to_json(),
                "overheads": self.overheads.to_json(), "fit": self.fit_info}  # fmt: skip

    @classmethod
    def from_json(cls, doc: dict, where: str | Path = "performance model") -> PerfModel:
        check_header(doc, where, format=FORMAT, versions=(VERSION,), kind="performance model",
                     error=ModelError)  # fmt: skip
        try:
            return cls(doc["hardware"], KernelModels.from_json(doc["kernels"]),
                       Overheads.from_json(doc["overheads"]), doc.get("fit"))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(
                f"{where}: not a performance model ({type(e).__name__}: {e})"
            ) from None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json()) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path | None = None) -> PerfModel:
        path = Path(path) if path else default_model_path()
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelError(
                f"{path}: no performance model (run `python -m perfmodel microbench` and `fit`)"
            ) from None
        except json.JSONDecodeError as e:
            raise ModelError(f"{path}: not JSON ({e.msg})") from None
        return cls.from_json(doc, path)

    # --- prediction ------------------------------------------------------------------------

    def predict_ops(self, ops: list[dict]) -> dict:
        step = step_dense_bytes(k for op in ops for k in op.get("kernels", []))
        return critical_path.traverse(
            ops, lambda k: self.kernels.predict(k, step),
            lambda op, kind: self.overheads.get(op, kind, step), self.overheads.step_end(step),
        )  # fmt: skip

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


_LOADED: dict[str, object] = {}


def load_model(path: str | Path | None = None, cfg=None, table_sizes: list[int] | None = None):
    """The model predictions use, loaded once: the one at `path` when given; else this
    machine's fully fitted model (`python -m perfmodel microbench` and `fit`) when the user made
    one; else, for a run's config `cfg` (its tables of `table_sizes` rows, default those its
    step is built with), the calibration of its shapes (perfmodel/calibration.py: measured now,
    in seconds, when absent). ModelError when there is none of them (no `cfg`; CalibrationOff
    when calibration is turned off)."""
    from perfmodel import calibration

    if path is None and not default_model_path().exists() and cfg is not None:
        if calibration.enabled():
            if table_sizes is None:  # the tables the run's step is built with
                from perfmodel.graph import capture_template

                table_sizes = capture_template(cfg)["meta"]["table_sizes"]
            return calibration.model_for(cfg, table_sizes, PerfModel)
        raise CalibrationOff(
            f"{default_model_path()}: no performance model (run `python -m perfmodel microbench` "
            "and `fit`), and calibration is off "
            f"({calibration.ENV}={os.environ.get(calibration.ENV)})"
        )
    key = str(path or default_model_path())
    if key not in _LOADED:
        _LOADED[key] = PerfModel.load(key)
    return _LOADED[key]


def predict_step_time(
    cfg, batch_size: int | None = None, model_path: str | Path | None = None
) -> dict:
    """Predicted training time of one batch of `cfg` (a TrainConfig; placement, precision and
    architecture as configured) at `batch_size` (default the config's), in microseconds:
    ``per_batch_us``, ``host_us``, ``device_active_us`` per stream and a ``breakdown`` by phase,
    kernel type and overhead kind. The first call for an architecture captures its execution
    graph (two tiny profiled steps, cached); later calls take milliseconds. Without a fitted
    model, the first call for the run's shapes calibrates one (`load_model`)."""
    return load_model(model_path, cfg).predict(cfg, batch_size)
