"""The kernel models as one collection (`KernelModels`): one model per operator type (see
`perfmodel.kernel_models`), chosen and fitted on held-out shapes, with in-situ factors that carry
an isolated kernel's time to its time inside a training step, and their JSON form."""

from __future__ import annotations

import json
import math
import random

import numpy as np

from perfmodel import features as F
from perfmodel.hardware import SLOW_LIMIT
from perfmodel.kernel_models import (
    EmbeddingModel,
    GemmMLP,
    GemmRoofline,
    RooflineTable,
    gmae,
    operator_key,
)

MLP_GRID = [(32, 2, 0.0), (64, 2, 0.0), (64, 3, 1e-4)]
SITU_BANDWIDTH = math.log(2.0)  # of the in-situ factor's size kernel, in log size
SITU_PRIOR = 0.1  # weight of a key's overall in-situ factor against its sized points
# the kinds whose in-situ factor depends on the step (`features.step_weights`, its bandwidth
# chosen with these kinds by leave-one-fit-trace-out): those that stream tensors other kernels
# of the step wrote; embedding lookups read their tables, which their own model's cache term
# covers (with them too: embedding backward 5.4 -> 7.1% in the same cross-validation)
SITU_STEP_KINDS = ("gemm", "bmm", "elementwise", "concat", "gather", "scatter")
# an in-situ factor is clamped to this range: a safety net, not a prior (fit traces measure
# 5-7x for 10-byte bias casts inside `aten::linear`, which a limit of 4 cut short)
SITU_LIMITS = (0.125, 8.0)


def _clamp_factor(log_factor: float) -> float:
    return min(max(math.exp(log_factor), SITU_LIMITS[0]), SITU_LIMITS[1])


def _log_step(step_bytes: float | None) -> float | None:
    return math.log(step_bytes) if step_bytes else None


def _round(x: float | None) -> float | None:
    return round(x, 6) if x is not None else None


def _add(totals: dict, key, measured: float, predicted: float) -> None:
    """Accumulate a (measured, predicted) pair of times under key."""
    t = totals.setdefault(key, [0.0, 0.0])
    t[0] += measured
    t[1] += predicted


def _steady_first(items: list[tuple[bool, object]]) -> list:
    """The values from steady traces when there are any, else all of them."""
    return [x for steady, x in items if steady] or [x for _, x in items]


def split_by_shape(recs: list[dict], frac: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Hold out a fraction of the distinct shapes (not of the samples): a held-out shape is
    never seen in fitting."""
    keys = sorted({json_key(r) for r in recs})
    rng = random.Random(seed)
    rng.shuffle(keys)
    held = set(keys[: max(1, int(len(keys) * frac))]) if len(keys) > 3 else set()
    return [r for r in recs if json_key(r) not in held], [r for r in recs if json_key(r) in held]


def json_key(r: dict) -> str:
    ctx = r.get("ctx") or {}
    return f"{r['name']}|{r.get('shapes')}|{r.get('dtypes')}|{ctx.get('zipf')}|{ctx.get('table_sizes')}"


class KernelModels:
    """One model per operator type; `predict(kernel_record)` in microseconds."""

    def __init__(
        self, models: dict | None = None, choice: dict | None = None, errors: dict | None = None
    ) -> None:
        self.models = models or {}
        self.choice = choice or {}
        self.errors = errors or {}
        self.in_situ: dict[str, float] = {}
        # per key, [log size, log factor, weight, log step bytes] points of the fit traces (see `situ_factor`)
        self.in_situ_points: dict[str, list[list[float]]] = {}
        self._points: dict[str, np.ndarray] = {}

    @staticmethod
    def situ_keys(k: dict) -> tuple[str, ...]:
        """The in-situ keys of a kernel, finest first: (operator name, dtype, GEMM operand
        strides or the roofline's key, the top-level op it runs in and its rank there); for an
        outer product (a GEMM with K = 1), the same with "outer" for the strides; the finest key
        without the op; operator type and dtype.
        The factor of the first key the fit traces have is applied.

        Outer products have a key of their own: their output is written cache-cold inside a step,
        and their strides hold the layer's width, so a held-out width would fall back to the
        GEMM-wide factor set by the big layers (docs/measurements/perfmodel.md).."""
        bf16 = any(d in ("c10::BFloat16", "c10::Half") for d in (k.get("dtypes") or []))
        dtype = "bf16" if bf16 else "fp32"
        kind = F.op_type(k["name"])
        if kind in ("gemm", "bmm"):
            name = f"{k['name']}|{dtype}|" + json.dumps(
                [list(s) for s in (k.get("strides") or [])[:3]]
            )
        else:
            name = operator_key(k)
        coarse = (name, f"{kind}|{dtype}")
        if not k.get("op"):
            return coarse
        if F.is_cross_gemm(k):
            # DCN's cross layers are a family of their own: an MLP layer's GEMM with the same
            # strides (a top layer as wide as the rank) or the MLP GEMMs' type-wide factor (1.3-1.4
            # here) made bf16 DCN steps 15-30% slow; without a DCN fit trace they keep their
            # microbenchmarked speed (docs/measurements/perfmodel.md, issue 38)
            return (f"{name}|{k['op']}", f"{name}|crossnet", f"{kind}|{dtype}|crossnet")
        dims = F.gemm_dims(k) if kind == "gemm" else None
        if dims is not None and dims["K"] == 1:
            return (f"{name}|{k['op']}", f"{k['name']}|{dtype}|outer|{k['op']}", *coarse)
        return (f"{name}|{k['op']}", *coarse)

    def calibrate_in_situ(
        self,
        traces: list[list[dict]],
        slowdowns: list[float | None] | None = None,
        steady: float = SLOW_LIMIT,
    ) -> dict:
        """Per kernel context (`situ_keys`), the factor between kernels timed inside training
        steps (the kernel records of each fit trace) and the isolated-microbenchmark models. A
        microbenchmark runs a kernel on warm, isolated inputs; inside a step the inputs come from
        other kernels (caches, layouts, allocation), which the factor carries over to predictions.
        The top-level op a kernel runs in (a weight cast inside `aten::linear`, a gradient cast
        in `ToCopyBackward0`) is the finest context.

        Per trace, a key's factor is its total measured over total predicted time; the key's
        factor is the geometric mean over the traces that have it. Each fit trace is one
        measurement of a shared machine in whatever state it was in (measured here: 1.1x to 1.8x
        slower than described between traces of one fit), so every trace counts once, as in the
        geomean errors the model is judged by; a sum over all traces would let the longest one
        set the factor of every key it has (fp32 keys from one slow fp32 trace, bf16 ones from a
        fast bf16 trace).

        With `slowdowns` (each trace's `machine_slowdown`), a key's factor comes from the traces
        measured on a steady machine (slowdown at most `steady`) when any has the key, and from
        all of them otherwise: a slow trace would carry its slowdown into every prediction of its
        keys (docs/measurements/perfmodel.md).

        Kernels other than GEMMs also keep their factor per size (`situ_size`): per trace and
        key, one point per distinct size (its measured over predicted total), weighted so that
        each trace counts once per key. A point also holds the log of its step's dense working
        set (the record's ``step_bytes``, see `features.step_dense_bytes`; None when the record
        has none), and the GEMMs of `SITU_STEP_KINDS` get points too, all at one size. A point
        is ``[log size, log factor, weight, log step bytes]``. `situ_factor` reads the factor at
        a kernel's size and step off these points."""
        self.in_situ, self.in_situ_points, self._points = {}, {}, {}
        # per key, one (steady trace?, value) per trace: its log factor, its sized points
        logs: dict[str, list[tuple[bool, float]]] = {}
        points: dict[str, list[tuple[bool, list[float]]]] = {}
        slowdowns = list(slowdowns) if slowdowns is not None else [None] * len(traces)
        for recs, slow in zip(traces, slowdowns):
            is_steady = slow is not None and slow <= steady
            sums: dict[str, list[float]] = {}
            sized: dict[str, dict[tuple, list[float]]] = {}
            for r in recs:
                pred = self._predict(r)
                if not math.isfinite(pred):  # a model that overflowed far from its sweep's
                    continue  # shapes says nothing of the step's factor (log(m / inf) failed)
                size = self._point_size(r, pred)
                step = _log_step(r.get("step_bytes"))
                for key in self.situ_keys(r):
                    _add(sums, key, r["dur_us"], pred)
                    if size is not None:
                        _add(sized.setdefault(key, {}), (round(size, 4), step), r["dur_us"], pred)
            for key, (m, p) in sums.items():
                if m > 0 and p > 0:
                    logs.setdefault(key, []).append((is_steady, math.log(m / p)))
            for key, by_size in sized.items():
                pts = [
                    (x, st, math.log(m / p))
                    for (x, st), (m, p) in by_size.items()
                    if m > 0 and p > 0
                ]
                weight = 1.0 / max(len(pts), 1)  # each trace counts once per key
                points.setdefault(key, []).extend(
                    (is_steady, [x, f, weight, st]) for x, st, f in pts
                )
        for key, v in logs.items():
            v = _steady_first(v)
            self.in_situ[key] = _clamp_factor(sum(v) / len(v))
            pts = _steady_first(points.get(key, []))
            if pts:
                self.in_situ_points[key] = [[_round(x) for x in pt] for pt in pts]
        return dict(self.in_situ)

    @staticmethod
    def situ_size(k: dict, predicted_us: float) -> float | None:
        """Where a kernel sits on its in-situ factor curve (natural log): bytes moved for the
        bandwidth-roofline kernels, the isolated model's time for embedding lookups; None for
        GEMMs, whose contexts are already per operand layout and keep one factor."""
        kind = F.op_type(k["name"])
        if kind in ("gemm", "bmm"):
            return None
        if kind.startswith("embedding"):
            return math.log(max(predicted_us, 1e-3))
        return math.log(max(F.bytes_moved(k), 1.0))

    @classmethod
    def _point_size(cls, k: dict, predicted_us: float) -> float | None:
        """`situ_size`, or one size for all of a key's kernels when their factor depends on the
        step only (GEMMs of the step kinds)."""
        size = cls.situ_size(k, predicted_us)
        if size is None and F.op_type(k["name"]) in SITU_STEP_KINDS:
            return 0.0
        return size

    def situ_factor(self, k: dict, predicted_us: float, step_bytes: float | None = None) -> float:
        """The in-situ factor of a kernel: of the first of its `situ_keys` the fit traces have,
        the factor at the kernel's size, a Gaussian-weighted mean of that key's log factors
        (bandwidth SITU_BANDWIDTH in log size) with the key's overall factor as a prior worth
        SITU_PRIOR of one trace; the overall factor where the key has no sized points. For the
        kinds of `SITU_STEP_KINDS` the points are also weighted by how far their step's dense
        working set is from the kernel's step's (`step_bytes`, else the record's own;
        `features.step_weights`): a step outside the fit traces' range reads the nearest ones.

        Per size, because a small kernel's inputs are still warm in the cache inside a step while a
        large one's come from DRAM; per step, because a kernel's inputs are colder the more the
        step streams through the caches between their writer and their reader (the figures are in
        docs/measurements/perfmodel.md)."""
        for key in self.situ_keys(k):
            if key not in self.in_situ:
                continue
            prior = math.log(self.in_situ[key])
            size = self._point_size(k, predicted_us)
            if size is None or key not in self.in_situ_points:
                return self.in_situ[key]
            pts = self._points.get(key)
            if pts is None:
                pts = self._points[key] = np.asarray(self.in_situ_points[key], dtype=np.float64)
            w = pts[:, 2] * np.exp(-0.5 * ((pts[:, 0] - size) / SITU_BANDWIDTH) ** 2)
            w = w * self._step_weights(k, pts, step_bytes)
            f = (float(w @ pts[:, 1]) + SITU_PRIOR * prior) / (float(w.sum()) + SITU_PRIOR)
            return _clamp_factor(f)
        return 1.0

    @staticmethod
    def _step_weights(k: dict, pts: np.ndarray, step_bytes: float | None) -> np.ndarray | float:
        """Weights of a key's sized points by how close their step is to the kernel's."""
        if F.op_type(k["name"]) not in SITU_STEP_KINDS or pts.shape[1] < 4:
            return 1.0
        step_bytes = step_bytes if step_bytes is not None else k.get("step_bytes")
        return F.step_weights(pts[:, 3], step_bytes) if step_bytes else 1.0

    def predict(self, k: dict, step_bytes: float | None = None) -> float:
        raw = self._predict(k)
        return raw * self.situ_factor(k, raw, step_bytes)

    def _predict(self, k: dict) -> float:
        t = F.op_type(k["name"])
        m = self.models.get(t) or self.models.get("elementwise")
        if m is None:
            return 0.0
        if t in ("gemm", "bmm") and F.gemm_dims(k) is None:
            m = self.models.get("elementwise")
        return max(float(m.predict(k)), 0.05)

    def fit(
        self,
        recs: list[dict],
        cache_bytes: float,
        seed: int = 0,
        holdout: float = 0.25,
        l2_bytes: float = 1 << 20,
        device_l2_bytes: float | None = None,
        gemm_mlp: bool = True,
    ) -> KernelModels:
        """`gemm_mlp` False: GEMMs by their roofline alone (a calibration's few shapes, each
        corrected in situ, give an MLP on log-shapes nothing to learn and cost seconds)."""
        by_type: dict[str, list[dict]] = {}
        for r in recs:
            if r.get("dur_us", 0) > 0:
                by_type.setdefault(F.op_type(r["name"]), []).append(r)
        for t, rs in by_type.items():
            train, test = split_by_shape(rs, holdout, seed)
            if not test:
                train, test = rs, rs
            only = None if gemm_mlp or t not in ("gemm", "bmm") else "roofline"
            cands = self._candidates(t, train, cache_bytes, l2_bytes, device_l2_bytes, seed, only)
            scored = []
            for name, model in cands:
                pred = [model.predict(r) for r in test]
                scored.append((gmae(pred, [r["dur_us"] for r in test]), name, model))
            scored.sort(key=lambda x: x[0])
            err, name, _ = scored[0]
            # refit the winner on everything
            final = dict(
                self._candidates(t, rs, cache_bytes, l2_bytes, device_l2_bytes, seed, only=name)
            )[name]
            self.models[t] = final
            self.choice[t] = name
            self.errors[t] = {"heldout_gmae": err, "candidates": {n: e for e, n, _ in scored},
                              "n_train": len(train), "n_heldout": len(test)}  # fmt: skip
        return self

    @staticmethod
    def _candidates(
        t: str,
        recs: list[dict],
        cache_bytes: float,
        l2_bytes: float,
        device_l2_bytes: float | None,
        seed: int,
        only: str | None = None,
    ):
        out = []
        if t in ("gemm", "bmm"):
            recs = [r for r in recs if F.gemm_dims(r) is not None]
            if only in (None, "roofline"):
                out.append(("roofline", GemmRoofline().fit(recs)))
            if only is None:
                # hyper-parameters by held-out error inside the training shapes
                inner_train, inner_val = split_by_shape(recs, 0.2, seed + 1)
                best = None
                for h, layers, wd in MLP_GRID:
                    m = GemmMLP(h, layers, wd).fit(inner_train or recs, seed)
                    e = gmae(
                        m.predict_many(inner_val or recs), [r["dur_us"] for r in inner_val or recs]
                    )
                    if best is None or e < best[0]:
                        best = (e, h, layers, wd)
                _, h, layers, wd = best
                out.append((f"mlp:{h}x{layers}:wd{wd}", GemmMLP(h, layers, wd).fit(recs, seed)))
            elif only.startswith("mlp:"):
                h, layers = only[4:].split(":")[0].split("x")
                wd = float(only.split(":wd")[1])
                out.append((only, GemmMLP(int(h), int(layers), wd).fit(recs, seed)))
        elif t in ("embedding_fwd", "embedding_bwd"):
            out.append(("bytes_hit_rate", EmbeddingModel({}, cache_bytes).fit(recs)))
        else:
            if only in (None, "roofline"):
                out.append(("roofline", RooflineTable().fit(recs)))
            if only in (None, "roofline_cache"):
                cache_model = RooflineTable(l2_bytes=l2_bytes, device_l2_bytes=device_l2_bytes)
                out.append(("roofline_cache", cache_model.fit(recs)))
        return out

    def to_json(self) -> dict:
        return {"models": {t: m.to_json() for t, m in self.models.items()}, "choice": self.choice,
                "errors": self.errors, "in_situ": self.in_situ,
                "in_situ_points": self.in_situ_points}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict) -> KernelModels:
        models = {}
        for t, m in data["models"].items():
            kind = m["kind"]
            if kind == "roofline_table":
                models[t] = RooflineTable(m["coefs"], m.get("l2_bytes"), m.get("device_l2_bytes"))
            elif kind == "gemm_roofline":
                models[t] = GemmRoofline(m["coefs"])
            elif kind == "gemm_mlp":
                models[t] = GemmMLP(m["hidden"], m["layers"], m["weight_decay"], state=m)
            elif kind == "embedding":
                models[t] = EmbeddingModel(m["coefs"], m["cache_bytes"])
            else:
                raise ValueError(f"unknown kernel model kind {kind!r}")
        out = cls(models, data.get("choice"), data.get("errors"))
        out.in_situ = dict(data.get("in_situ") or {})
        out.in_situ_points = dict(data.get("in_situ_points") or {})
        return out
