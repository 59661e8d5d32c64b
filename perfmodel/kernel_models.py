"""Kernel models: predicted time of one kernel from its record (shapes, dtypes, context).

- GEMM (addmm/mm) and bmm: either a roofline with learned efficiency
  (t = c0 + flops / (peak * eff) + bytes / bw_eff, per dtype) or a small MLP on log-shapes,
  dtype and operand layouts, predicting log t, with width/depth/weight decay chosen by held-out
  geomean error; the fit keeps whichever is more accurate on held-out shapes.
- Embedding lookups (fbgemm table-batched forward, backward with the fused optimizer): bytes
  moved, split by a cache hit-rate term. The last-level cache is assumed to hold the rows with
  the highest access rate across all tables (Zipf per table, `hit_rate`); lookups of resident
  rows cost row_bytes / bw_cache, the others row_bytes / bw_dram, plus per-lookup, per-unique-row
  (the fused update) and per-output costs, all learned (non-negative).
- Everything else (element-wise, concat, gather/scatter, copies): a bandwidth roofline with a
  learned fixed cost, t = c0 + bytes / bw_eff, per operator (and dtype pair); unseen operators
  use the pooled element-wise fit.

Fits minimise relative error (least squares weighted by 1/t), which is what the geomean error
reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from embeddings.optimizer import SPARSE_OPTIMIZERS, SparseOptimizer
from perfmodel import features as F

# --- cache residency of Zipf-distributed rows ------------------------------------------------


def _rank_buckets(n_rows: int, alpha: float, n_buckets: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one table grouped by rank (log-spaced): (rows per bucket, probability per row)."""
    edges = np.unique(np.round(np.geomspace(1, n_rows + 1, n_buckets + 1)).astype(np.int64))
    edges[0], edges[-1] = 1, n_rows + 1
    lo, hi = edges[:-1].astype(np.float64), edges[1:].astype(np.float64)
    # The generator's continuous bounded power law: mass of ranks [lo, hi) ~ hi^(1-a) - lo^(1-a)
    om = 1.0 - alpha if abs(1.0 - alpha) > 1e-4 else 1e-4
    norm = (n_rows + 1.0) ** om - 1.0
    mass = (hi**om - lo**om) / norm
    count = hi - lo
    return count, mass / count


def hit_rate(
    table_sizes: list[int], alpha: float, draws: float, row_bytes: float, cache_bytes: float
) -> dict:
    """Expected cache hit rate of one batch's lookups and its unique rows, for `draws` ids per
    table and batch (the batch size times the mean ids per bag).

    The cache is filled with the globally most-accessed rows (per-row rate = draws * p(row));
    `hit` is the share of lookups that go to them. `unique` is the expected number of distinct
    rows a batch touches, sum over rows of 1 - (1 - p)^draws.
    """
    counts, probs, unique = [], [], 0.0
    for n in table_sizes:
        c, p = _rank_buckets(int(n), alpha)
        counts.append(c)
        probs.append(p)
        unique += float(np.sum(c * -np.expm1(draws * np.log1p(-np.minimum(p, 1 - 1e-12)))))
    c = np.concatenate(counts)
    p = np.concatenate(probs)
    order = np.argsort(-p)
    c, p = c[order], p[order]
    capacity = cache_bytes / max(row_bytes, 1.0)
    cum = np.cumsum(c)
    full = cum <= capacity
    mass = float(np.sum((c * p)[full]))
    k = int(np.sum(full))
    if k < len(c):
        prev = cum[k - 1] if k else 0.0
        mass += float(max(capacity - prev, 0.0) * p[k])
    return {"hit": min(mass / len(table_sizes), 1.0), "unique": unique}


# --- least squares helpers ---------------------------------------------------------------------


def nnls_relative(X: np.ndarray, t: np.ndarray, iters: int = 2000) -> np.ndarray:
    """Non-negative coefficients w minimising sum(((X w) / t - 1)^2) (projected gradient on the
    normal equations, started from the unconstrained solution)."""
    A = X / t[:, None]
    b = np.ones(len(t))
    scale = np.maximum(np.abs(A).max(axis=0), 1e-30)
    A = A / scale
    w, *_ = np.linalg.lstsq(A, b, rcond=None)
    w = np.maximum(w, 0.0)
    AtA, Atb = A.T @ A, A.T @ b
    step = 1.0 / max(np.linalg.eigvalsh(AtA).max(), 1e-12)
    for _ in range(iters):
        w = np.maximum(w - step * (AtA @ w - Atb), 0.0)
    return w / scale


def gmae(pred, meas) -> float:
    """Geometric mean of |pred/meas - 1|, as a fraction (zero errors floored at 1e-6)."""
    errs = [max(abs(p / m - 1.0), 1e-6) for p, m in zip(pred, meas) if m > 0]
    return float(math.exp(sum(math.log(e) for e in errs) / len(errs))) if errs else float("nan")


# --- models ------------------------------------------------------------------------------------


def operator_key(k: dict) -> str:
    """Operator, the first two dtypes, and what changes its cost per byte: a strided
    (non-contiguous) operand, an `index_add_` with alpha (a slower per-row path than alpha 1),
    a CUDA device (on a CUDA machine the host tier's kernels run on the CPU beside it)."""
    d = k.get("dtypes") or []
    key = f"{k['name']}|{'/'.join(d[:2])}"
    if F.on_device(k):
        key += "|cuda"
    if not F.all_contiguous(k):
        key += "|strided"
    alpha = (k.get("scalars") or {}).get("4")
    if k["name"] == "aten::index_add_" and alpha not in (None, 1, 1.0):
        key += "|alpha"
    return key


class RooflineTable:
    """t = c0 + bytes * inv_bw per operator key; pooled fallbacks per operator and overall.

    With `l2_bytes` (kind ``roofline_cache``) two more terms: the bytes beyond the per-core L2
    (a working set that spills streams at the slower next-level bandwidth; for a CUDA device's
    kernels, beyond the device's L2, `device_l2_bytes`, when it is known) and the number of
    indices of an indexed op (a per-row cost: index_add_ runs one small add per index).
    """

    def __init__(self, coefs: dict[str, list[float]] | None = None, l2_bytes: float | None = None,
                 device_l2_bytes: float | None = None) -> None:  # fmt: skip
        self.coefs = coefs or {}
        self.l2_bytes = l2_bytes
        self.device_l2_bytes = device_l2_bytes  # a CUDA device's L2, for its kernels

    def terms(self, k: dict) -> list[float]:
        b = F.bytes_moved(k)
        if self.l2_bytes is None:
            return [1.0, b]
        l2 = self.device_l2_bytes if F.on_device(k) and self.device_l2_bytes else self.l2_bytes
        return [1.0, b, max(b - l2, 0.0), float(F.index_count(k))]

    def fit(self, recs: list[dict]) -> RooflineTable:
        groups: dict[str, list[dict]] = {"*": recs}
        for r in recs:
            groups.setdefault(operator_key(r), []).append(r)
            groups.setdefault(r["name"], []).append(r)
        for key, rs in groups.items():
            if len(rs) < 2 and key != "*":
                continue
            X = np.array([self.terms(r) for r in rs])
            t = np.array([r["dur_us"] for r in rs])
            self.coefs[key] = nnls_relative(X, t).tolist()
        return self

    def predict(self, k: dict) -> float:
        c = self.coefs.get(operator_key(k)) or self.coefs.get(k["name"]) or self.coefs.get("*")
        return float(np.dot(c, self.terms(k))) if c else 1.0

    def to_json(self) -> dict:
        return {"kind": "roofline_table", "coefs": self.coefs, "l2_bytes": self.l2_bytes,
                "device_l2_bytes": self.device_l2_bytes}  # fmt: skip


class GemmRoofline:
    """t = c0 + batch * cb + flops * c1 + bytes * c2 per (dtype, layout): c1 = 1 / (peak *
    efficiency), cb the per-matrix cost of a batched matmul."""

    def __init__(self, coefs: dict[str, list[float]] | None = None) -> None:
        self.coefs = coefs or {}

    @staticmethod
    def _k(d: dict) -> str:
        return f"{d['bf16']}{d['ta']}{d['tb']}{d['bias']}"

    def fit(self, recs: list[dict]) -> GemmRoofline:
        groups: dict[str, list] = {}
        for r in recs:
            d = F.gemm_dims(r)
            groups.setdefault(self._k(d), []).append((d, r["dur_us"]))
            groups.setdefault(str(d["bf16"]), []).append((d, r["dur_us"]))
        for key, rows in groups.items():
            X = np.array([_roof_terms(d) for d, _ in rows])
            self.coefs[key] = nnls_relative(X, np.array([t for _, t in rows])).tolist()
        return self

    def predict(self, k: dict) -> float:
        d = F.gemm_dims(k)
        c = self.coefs.get(self._k(d)) or self.coefs.get(str(d["bf16"])) or [1.0, 0.0, 1e-4, 0.0]
        return float(np.dot(c, _roof_terms(d)))

    def to_json(self) -> dict:
        return {"kind": "gemm_roofline", "coefs": self.coefs}


N_FEATURES = 10  # len(features.gemm_features(...))


def _roof_terms(d: dict) -> list[float]:
    return [1.0, float(d["batch"]), F.gemm_flops(d), F.gemm_bytes(d)]


class GemmMLP:
    """A small MLP on log-shapes predicting log2(t)."""

    def __init__(
        self,
        hidden: int = 64,
        layers: int = 2,
        weight_decay: float = 0.0,
        state: dict | None = None,
    ) -> None:
        self.hidden, self.layers, self.weight_decay = hidden, layers, weight_decay
        self.net = self._make()
        self.mu = np.zeros(N_FEATURES)
        self.sd = np.ones(N_FEATURES)
        if state is not None:
            self.mu, self.sd = np.array(state["mu"]), np.array(state["sd"])
            self.net.load_state_dict({k: torch.tensor(v) for k, v in state["weights"].items()})

    def _make(self) -> torch.nn.Module:
        mods: list[torch.nn.Module] = []
        width = N_FEATURES
        for _ in range(self.layers):
            mods += [torch.nn.Linear(width, self.hidden), torch.nn.GELU()]
            width = self.hidden
        mods.append(torch.nn.Linear(width, 1))
        return torch.nn.Sequential(*mods).double()

    def fit(self, recs: list[dict], seed: int = 0, iters: int = 400) -> GemmMLP:
        """Full-batch L-BFGS on the squared error of log2 t (a few hundred samples)."""
        X = np.array([F.gemm_features(F.gemm_dims(r)) for r in recs])
        y = np.log2(np.array([r["dur_us"] for r in recs]))
        self.mu, self.sd = X.mean(axis=0), np.maximum(X.std(axis=0), 1e-6)
        torch.manual_seed(seed)
        self.net = self._make()
        xt = torch.tensor((X - self.mu) / self.sd)
        yt = torch.tensor(y)[:, None]
        params = list(self.net.parameters())
        opt = torch.optim.LBFGS(
            params, lr=1.0, max_iter=iters, history_size=20, line_search_fn="strong_wolfe"
        )

        def closure():
            opt.zero_grad()
            loss = torch.mean((self.net(xt) - yt) ** 2)
            loss = loss + self.weight_decay * sum((p**2).sum() for p in params)
            loss.backward()
            return loss

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny matrices: a thread team only adds waiting
        try:
            opt.step(closure)
        finally:
            torch.set_num_threads(threads)
        return self

    def predict_many(self, recs: list[dict]) -> np.ndarray:
        X = np.array([F.gemm_features(F.gemm_dims(r)) for r in recs])
        with torch.no_grad():
            out = self.net(torch.tensor((X - self.mu) / self.sd)).numpy()[:, 0]
        return np.exp2(out)

    def predict(self, k: dict) -> float:
        return float(self.predict_many([k])[0])

    def to_json(self) -> dict:
        return {
            "kind": "gemm_mlp", "hidden": self.hidden, "layers": self.layers,
            "weight_decay": self.weight_decay, "mu": self.mu.tolist(), "sd": self.sd.tolist(),
            "weights": {k: v.tolist() for k, v in self.net.state_dict().items()},
        }  # fmt: skip


@dataclass
class EmbeddingModel:
    """Bytes moved with a cache hit-rate term, per fbgemm kernel (forward, backward+optimizer)."""

    coefs: dict[str, list[float]]
    cache_bytes: float

    TERMS = ("fixed", "lookup", "miss_bytes", "hit_bytes", "unique_row_bytes", "out_bytes")

    def terms(self, k: dict) -> list[float]:
        ctx = k.get("ctx") or {}
        sizes = ctx.get("table_sizes") or [1]
        dim = int(ctx.get("embedding_dim", 16))
        batch = int(ctx.get("batch_size", 1))
        kind = ctx.get("optimizer", "sgd")
        # a trace from an optimizer not known here counts as stateless
        state = SparseOptimizer(kind).state_floats(dim) if kind in SPARSE_OPTIMIZERS else 0
        row_bytes = 4.0 * (dim + state)
        lookups = (
            float(F.numel(k["shapes"][ctx.get("indices_arg", _indices_arg(k))]))
            if k.get("shapes")
            else batch * len(sizes)
        )
        # ids per table and batch: the batch size times the mean ids per bag (multi-hot bags)
        draws = lookups / len(sizes)
        hr = hit_rate(sizes, float(ctx.get("zipf", 1.05)), draws, row_bytes, self.cache_bytes)
        return [
            1.0, lookups, lookups * row_bytes * (1 - hr["hit"]), lookups * row_bytes * hr["hit"],
            hr["unique"] * row_bytes, batch * len(sizes) * dim * 4.0,
        ]  # fmt: skip

    def fit(self, recs: list[dict]) -> EmbeddingModel:
        groups: dict[str, list[dict]] = {}
        for r in recs:
            groups.setdefault(r["name"], []).append(r)
        for name, rs in groups.items():
            X = np.array([self.terms(r) for r in rs])
            self.coefs[name] = nnls_relative(X, np.array([r["dur_us"] for r in rs])).tolist()
        return self

    def predict(self, k: dict) -> float:
        c = self.coefs.get(k["name"])
        if c is None:  # same direction, another optimizer: the closest fitted kernel
            same = [n for n in self.coefs if ("forward" in n) == ("forward" in k["name"])]
            c = self.coefs[same[0]] if same else [1.0] + [0.0] * 5
        return float(np.dot(c, self.terms(k)))

    def to_json(self) -> dict:
        return {"kind": "embedding", "coefs": self.coefs, "cache_bytes": self.cache_bytes}


def _indices_arg(k: dict) -> int:
    """Position of the indices tensor in fbgemm's CPU kernels: the 1-D integer tensor right
    before the offsets, a 1-D integer tensor of tables x batch + 1 entries; at least as many ids
    as bags (one per bag one-hot, more with multi-hot bags). Of the pairs that fit, the one with
    the most offsets (the per-table offset arrays before it also fit, with a few entries)."""
    shapes = k.get("shapes") or []
    dtypes = k.get("dtypes") or []
    best, best_n = 0, -1
    for i in range(len(shapes) - 1):
        a, b = shapes[i], shapes[i + 1]
        ints = all("int" in (dtypes[j] if j < len(dtypes) else "int") for j in (i, i + 1))
        if (
            len(a) == 1
            and len(b) == 1
            and ints
            and int(a[0]) >= int(b[0]) - 1
            and int(b[0]) >= best_n
        ):
            best, best_n = i, int(b[0])
    return best
