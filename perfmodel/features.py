"""What a kernel record says about its work: operator type, bytes moved, GEMM shapes.

A kernel record is a trace kernel (see `perfmodel.trace`) plus the trace's ``meta`` (batch
size, tables, Zipf exponent, optimizer, precision) under ``ctx``. Microbenchmarks write the same
records, so the models never know where a sample came from.
"""

from __future__ import annotations

import math

import numpy as np

ESIZE = {
    "float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
    "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1,
}  # fmt: skip

GEMM_OPS = {"aten::addmm", "aten::mm"}
SCATTER_OPS = {
    "aten::index_add_", "aten::scatter_add_", "aten::index_put_", "aten::index_copy_",
    "aten::index_fill_",
}  # fmt: skip
BMM_OPS = {"aten::bmm", "aten::baddbmm"}


def is_cross_gemm(k: dict) -> bool:
    """A GEMM of DCN's cross layers (`dlrm.models.dlrm.LowRankCrossNet`): their linears have no
    bias, so autograd runs them as `mm` in `aten::linear` and in `MmBackward0` (an MLP layer's
    are `addmm`, `AddmmBackward0` and the padded and narrow linears' own backward). Needs the
    kernel's context in its op (``op``, `graph.kernel_contexts`)."""
    if k["name"] not in GEMM_OPS:
        return False
    op = str(k.get("op", "")).split("#")[0]
    return op == CROSS_BACKWARD_OP or (k["name"] == "aten::mm" and op == "aten::linear")


# the profiler's name of the autograd node of a bias-free linear's matmul
CROSS_BACKWARD_OP = "autograd::engine::evaluate_function: MmBackward0"


def on_device(k: dict) -> bool:
    """Whether a kernel ran on a CUDA device (``stream`` = ``cuda:<n>``) rather than the host."""
    return str(k.get("stream", "cpu")).startswith("cuda")


def op_type(name: str) -> str:
    """The operator type a kernel model and its error are reported under."""
    if name in GEMM_OPS:
        return "gemm"
    if name in BMM_OPS:
        return "bmm"
    if "split_embedding" in name and "forward" in name:
        return "embedding_fwd"
    if "split_embedding" in name and "backward" in name:
        return "embedding_bwd"
    if name == "aten::index_select":
        return "gather"
    if name in SCATTER_OPS:
        return "scatter"
    if name == "aten::cat":
        return "concat"
    if "memcpy" in name.lower():
        return "h2d_copy"
    if "embedding_bag" in name:
        return "embedding_bag"
    return "elementwise"


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def tensor_bytes(k: dict) -> list[int]:
    out = []
    dtypes = k.get("dtypes") or []
    for i, s in enumerate(k.get("shapes") or []):
        esize = ESIZE.get(dtypes[i] if i < len(dtypes) else "float", 0)
        if s and esize:
            out.append(numel(s) * esize)
    return out


def bytes_moved(k: dict) -> float:
    """Bytes read and written by a memory-bound kernel (inputs plus an output as big as the
    largest input; a cat's inputs are not recorded, so its output shape is)."""
    if k.get("out_shape"):
        esize = ESIZE.get(k.get("out_dtype", "float"), 4)
        return 2.0 * numel(k["out_shape"]) * esize
    name = k["name"]
    if "_foreach_" in name or "_fused_" in name:  # tensor lists: shapes not recorded
        return 3.0 * 4.0 * float((k.get("ctx") or {}).get("dense_params") or 0)
    sizes = tensor_bytes(k)
    if not sizes:
        return 0.0
    shapes, dtypes = k.get("shapes") or [], k.get("dtypes") or []
    es0 = ESIZE.get(dtypes[0] if dtypes else "float", 4)
    if name in ("aten::sum", "aten::mean"):
        return float(sum(sizes))
    if name == "aten::index_select" and len(shapes) >= 3:
        # out = the source with its `dim` extent replaced by the number of indices
        src, idx = shapes[0], shapes[2]
        dim = int((k.get("scalars") or {}).get("1", 1 if len(src) > 1 else 0))
        out = numel(src) // max(int(src[dim]), 1) * numel(idx)
        return float(2 * out * es0 + numel(idx) * 8)
    if name == "aten::index_fill_" and len(shapes) >= 3 and shapes[0]:
        # a value written to every indexed slice of dim (recorded as a scalar)
        dim = int((k.get("scalars") or {}).get("1", 0))
        per_index = numel(shapes[0]) // max(int(shapes[0][dim]), 1)
        return float(numel(shapes[2]) * (per_index * es0 + 8))
    if (name in SCATTER_OPS or name == "aten::index_put") and len(shapes) >= 3:
        # only the written rows move, not the whole destination
        src_bytes = (
            numel(
                shapes[-1]
                if name.startswith("aten::index_put")
                else shapes[3]
                if len(shapes) > 3
                else shapes[-1]
            )
            * es0
        )
        return float(3 * src_bytes)
    if "embedding_bag" in name and len(shapes) >= 2 and len(shapes[0]) == 2:
        dim = int(shapes[0][1])
        return float(numel(shapes[1]) * dim * es0 * 2 + numel(shapes[1]) * 8)
    return float(sum(sizes) + max(sizes))


DENSE_TYPES = ("gemm", "bmm", "elementwise")


def step_dense_bytes(kernels) -> float:
    """Bytes moved by one step's dense kernels (GEMMs, bmm, element-wise): how much the step
    streams through the caches, which sets how cold a kernel's inputs are by the time it runs."""
    return float(sum(bytes_moved(k) for k in kernels if op_type(k["name"]) in DENSE_TYPES))


# Bandwidth of the Gaussian over fit steps by their dense working set (log bytes), shared by the
# kernels' in-situ factors and the overheads. Chosen by leave-one-fit-trace-out over 15 fit
# traces (mean geomean kernel error over the types 7.8% without weighting by step, 7.1% with
# sqrt(2), 7.6% with 2)
STEP_BANDWIDTH = math.log(math.sqrt(2.0))


def step_weights(log_steps, step_bytes: float) -> np.ndarray:
    """Weights of fit steps (the logs of their `step_dense_bytes`; NaN where unknown, weight 1)
    for a step that moves `step_bytes`: a Gaussian in log bytes counted from the nearest fit
    step, so a step outside the fitted range reads the nearest ones rather than none."""
    d = np.abs(np.asarray(log_steps, dtype=np.float64) - math.log(step_bytes))
    known = ~np.isnan(d)
    if not known.any():
        return np.ones_like(d)
    d = np.where(known, d - d[known].min(), 0.0)
    return np.exp(-0.5 * (d / STEP_BANDWIDTH) ** 2)


INDEXED_OPS = {"aten::index_select", "aten::index_add_", "aten::index_copy_", "aten::index_fill_"}


def index_count(k: dict) -> int:
    """Number of indices of an indexed op (its third argument; 0 for other ops)."""
    shapes = k.get("shapes") or []
    return numel(shapes[2]) if k["name"] in INDEXED_OPS and len(shapes) > 2 and shapes[2] else 0


def all_contiguous(k: dict) -> bool:
    """Whether every recorded tensor operand is row-major contiguous."""
    for shape, stride in zip(k.get("shapes") or [], k.get("strides") or []):
        if not shape or not stride or len(shape) != len(stride):
            continue
        expect = 1
        for n, st in zip(reversed(shape), reversed(stride)):
            if int(n) > 1 and int(st) != expect:
                return False
            expect *= int(n)
    return True


def _is_t(shape, stride) -> int:
    """1 when a 2-D (or batched) operand is a transposed view (column-major)."""
    if not stride or len(stride) < 2 or len(shape) < 2:
        return 0
    return int(stride[-2] == 1 and int(shape[-2]) > 1 and stride[-1] != 1)


def gemm_dims(k: dict) -> dict | None:
    """M, N, K, batch, dtype and operand layouts of a matmul kernel record."""
    shapes, strides, dtypes = k.get("shapes") or [], k.get("strides") or [], k.get("dtypes") or []
    name = k["name"]
    ia = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
    if len(shapes) < ia + 2:
        return None
    a, b = shapes[ia], shapes[ia + 1]
    if len(a) < 2 or len(b) < 2:
        return None
    sa = strides[ia] if len(strides) > ia else []
    sb = strides[ia + 1] if len(strides) > ia + 1 else []
    return {
        "M": int(a[-2]), "K": int(a[-1]), "N": int(b[-1]),
        "batch": int(a[0]) if len(a) == 3 else 1,
        "bf16": int((dtypes[ia] if len(dtypes) > ia else "float") in ("c10::BFloat16", "c10::Half")),
        "ta": _is_t(a, sa), "tb": _is_t(b, sb), "bias": int(ia == 1),
    }  # fmt: skip


def gemm_flops(d: dict) -> float:
    return 2.0 * d["batch"] * d["M"] * d["N"] * d["K"]


def gemm_bytes(d: dict) -> float:
    es = 2 if d["bf16"] else 4
    return float(d["batch"] * (d["M"] * d["K"] + d["K"] * d["N"] + d["M"] * d["N"]) * es)


def gemm_features(d: dict) -> list[float]:
    """Inputs of the learned GEMM model: log-shapes, dtype and layouts."""
    return [
        math.log2(d["M"]), math.log2(d["N"]), math.log2(d["K"]), math.log2(d["batch"]),
        float(d["bf16"]), float(d["ta"]), float(d["tb"]), float(d["bias"]),
        math.log2(gemm_flops(d)), math.log2(gemm_bytes(d)),
    ]  # fmt: skip
