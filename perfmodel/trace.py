"""Recording training steps with torch.profiler and turning them into the execution-graph JSON.

The perf-trace format (``FORMAT``/``VERSION`` below), one JSON object per file::

    {"format": "hybrid-dlrm/perf-trace", "version": 1,
     "meta": {"batch_size": 2048, "precision": "fp32", "device": "cpu", "threads": 1,
              "config": {...TrainConfig...}, "table_sizes": [...], "embedding_dim": 16,
              "zipf": 1.05, "optimizer": "sgd", "placement": "device", "torch": "2.13.0",
              "profiler_event_cost_us": 1.1},
     "steps": [{"step": 0, "dur_us": 8123.4, "wall_us": 8200.1, "cpu_us": 8010.7,
                "ops": [{"name": "aten::linear", "phase": "forward", "thread": 1,
                         "start_us": 12.0, "dur_us": 310.5, "n_events": 14,
                         "shapes": [[2048, 13], [512, 13], [512]], "dtypes": ["float", ...],
                         "sync": false,
                         "kernels": [{"name": "aten::addmm", "stream": "cpu",
                                      "start_us": 30.1, "dur_us": 280.2, "n_events": 5,
                                      "launch_us": 0.0,
                                      "shapes": [[512], [2048, 13], [13, 512]],
                                      "strides": [[1], [13, 1], [1, 13]],
                                      "dtypes": ["float", "float", "float"]}]}]}]}

Times are microseconds relative to the step's start; a step's ``cpu_us`` is the training
thread's CPU time over it, so ``cpu_us / wall_us`` below 1 says other processes took the core
for a while (the meta's ``unprofiled_step_us``/``unprofiled_step_cpu_us`` are medians of plain
steps, without the profiler, when the writer measured them). An *op* is a top-level operator of the
step (inside the ``perf::step`` label): an operator with no parent but the phase labels
``perf::forward``, ``perf::embedding_lookup``, ``perf::backward`` and ``perf::optimizer``, or
an autograd engine node running on another thread (CUDA).
Its ``phase`` is the innermost label around it (autograd engine nodes are always ``backward``,
``Optimizer.*`` ops ``optimizer``); unlabelled ops between the forward pass and backward are the
``loss``, other unlabelled ones ``other``. A *kernel* is where an op's work is done: the outermost
compute operator inside the op (``aten::addmm`` inside ``aten::linear``, ``aten::copy_`` inside
an autocast ``aten::to``, fbgemm's ``*_cpu`` kernels inside the lookup wrappers), with its
shapes, strides and dtypes. On CPU, where nothing is launched, its span is its time, ``stream``
= ``cpu`` and ``launch_us`` = 0; on CUDA its time is the summed duration of the device kernels it
launched (``device_kernels`` their names, ``stream`` = ``cuda:<device>``, ``launch_us`` its
``cudaLaunchKernel`` calls), and a compute operator that launched nothing ran on the host and
stays a ``cpu`` kernel. ``n_events`` counts the profiler events inside a span: each costs
``profiler_event_cost_us`` that an unprofiled run does not pay, and the overhead statistics
subtract it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from hybrid_dlrm.common.atomic import write_json
from hybrid_dlrm.common.header import check_header
from perfmodel.errors import TraceError

FORMAT = "hybrid-dlrm/perf-trace"
VERSION = 1
PHASES = ("forward", "embedding_lookup", "loss", "backward", "optimizer", "other")
LABEL_PREFIX = "perf::"
STEP_LABEL = "perf::step"

# Views and allocations: no data moves, so never a kernel.
METADATA_OPS = {
    "aten::as_strided", "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::transpose",
    "aten::t", "aten::expand", "aten::narrow", "aten::slice", "aten::select", "aten::squeeze",
    "aten::unsqueeze", "aten::permute", "aten::flatten", "aten::detach", "detach", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::resolve_conj", "aten::resolve_neg",
    "aten::_unsafe_view", "aten::alias", "aten::lift_fresh", "aten::new_empty",
    "aten::new_empty_strided", "aten::item", "aten::_local_scalar_dense", "aten::to",
    "aten::_to_copy", "aten::contiguous", "aten::clone", "aten::split", "aten::split_with_sizes",
    "aten::chunk", "aten::unbind", "aten::set_", "aten::is_nonzero", "aten::result_type",
    "torch::autograd::AccumulateGrad", "aten::ones_like", "aten::zeros_like", "aten::new_zeros",
    "aten::zeros", "aten::ones", "aten::full", "aten::numpy_T", "aten::linear", "aten::relu",
    "aten::matmul", "aten::log_sigmoid", "aten::binary_cross_entropy_with_logits",
    "aten::index_select_backward", "aten::mean", "aten::view_as", "aten::as_strided_", "aten::resize_",
    "aten::_has_compatible_shallow_copy_type", "aten::is_same_size", "aten::embedding_bag",
    "aten::_embedding_bag_backward", "aten::embedding_backward",
}  # fmt: skip
# Ops that do the work even though the profiler shows children (bias broadcast, sub-steps).
COMPUTE_OPS = {
    "aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::index_select",
    "aten::index_add_", "aten::scatter_add_", "aten::index_put_", "aten::index_copy_",
    "aten::index_fill_", "aten::cat", "aten::sum",
    "aten::copy_", "aten::add_", "aten::add", "aten::div_", "aten::zero_", "aten::fill_",
    "aten::log_sigmoid_forward", "aten::log_sigmoid_backward", "aten::sigmoid", "aten::mul",
    "aten::mul_", "aten::sub_", "aten::sqrt", "aten::addcmul_", "aten::addcdiv_",
    "aten::clamp_min", "aten::threshold_backward", "aten::_foreach_add_",
}  # fmt: skip
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync"}
SYNC_OPS = {
    "aten::item",
    "aten::_local_scalar_dense",
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
}
_FBGEMM_KERNEL = re.compile(r"^fbgemm::(split_embedding_.*_cpu|bounds_check_indices)$")


def is_compute(name: str) -> bool:
    return (
        name in COMPUTE_OPS
        or name.startswith("aten::_foreach_")
        or bool(_FBGEMM_KERNEL.match(name))
    )


def _span(e) -> tuple[float, float]:
    return float(e.time_range.start), float(e.time_range.end)


def _count(e) -> int:
    return 1 + sum(_count(c) for c in e.cpu_children)


def _shapes(e) -> list:
    return [list(s) if isinstance(s, (list, tuple)) else [] for s in (e.input_shapes or [])]


def _strides(e) -> list:
    raw = getattr(e, "structured_input_strides", None) or []
    return [
        list(s) if isinstance(s, (list, tuple)) and all(isinstance(x, int) for x in s) else []
        for s in raw
    ]


def _cpu_kernels(e, out: list) -> None:
    """Outermost compute ops under e (e excluded), in time order: listed compute ops, and any
    other operator that is not a view/allocation/wrapper and has no compute op inside."""
    for c in e.cpu_children:
        if is_compute(c.name):
            out.append(c)
        elif c.name.startswith("cuda"):  # a CUDA runtime call (launch, copy, sync): not an op
            continue
        elif c.name in METADATA_OPS or c.name.startswith(LABEL_PREFIX) or _is_host_only(c.name):
            _cpu_kernels(c, out)
        else:
            inner: list = []
            _cpu_kernels(c, inner)
            out.extend(inner or [c])


def _cpu_kernel(k, s0: float) -> dict:
    out = {"name": k.name, "stream": "cpu", "start_us": _span(k)[0] - s0,
           "dur_us": _span(k)[1] - _span(k)[0], "n_events": _count(k), "launch_us": 0.0,
           "shapes": _shapes(k), "strides": _strides(k), "dtypes": [str(d) for d in (k.input_dtypes or [])]}  # fmt: skip
    scalars = _scalars(k)
    if scalars:
        out["scalars"] = scalars
    if k.name == "aten::cat":  # a TensorList's shapes are not recorded: the output's are, by narrow
        for c in k.cpu_children:
            if c.name in ("aten::narrow", "aten::slice") and c.input_shapes and c.input_shapes[0]:
                out["out_shape"] = list(c.input_shapes[0])
                out["out_dtype"] = str((c.input_dtypes or ["float"])[0])
                break
    return out


def _is_host_only(name: str) -> bool:
    """Ops that only do bookkeeping on the host (autograd nodes that pass gradients through,
    optimizer wrappers): never kernels themselves."""
    return name.startswith(("autograd::", "Optimizer.", "torch::autograd::")) or name.endswith(
        ("Backward", "Backward0", "Backward1")
    )


def _scalars(e) -> dict[str, float]:
    """Scalar arguments by position (e.g. index_select's dim), where the profiler kept them."""
    out = {}
    for i, v in enumerate(getattr(e, "concrete_inputs", None) or []):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[str(i)] = v
    return out


def _has_sync(e) -> bool:
    return e.name in SYNC_OPS or any(_has_sync(c) for c in e.cpu_children)


def _device_work(e) -> tuple[list, float]:
    """The CUDA kernels launched inside op e (its subtree), and the time its launch calls took.
    The profiler attaches a device kernel to the runtime call that launched it
    (``cudaLaunchKernel``) and may also list it on the enclosing operator: the runtime calls'
    kernels are taken when there are any, so none is counted twice."""
    events = list(_walk(e))
    launched = [
        k
        for ev in events
        if ev.name.startswith("cuda")
        for k in (getattr(ev, "kernels", None) or [])
    ]
    kernels = launched or [k for ev in events for k in (getattr(ev, "kernels", None) or [])]
    launch_us = sum(_span(ev)[1] - _span(ev)[0] for ev in events if ev.name in LAUNCH_CALLS)
    return kernels, launch_us


def _cuda_kernel(k, s0: float) -> dict:
    """A compute op of a CUDA step as a kernel record: the op's name, shapes and dtypes (what the
    kernel models read, as on CPU), the summed duration of the device kernels it launched on
    their stream, its launch calls' time. An op that launched nothing ran on the host (a table
    tier in host memory, index preparation) and stays a ``cpu`` kernel."""
    out = _cpu_kernel(k, s0)
    kernels, launch_us = _device_work(k)
    if kernels:
        out.update(stream=f"cuda:{getattr(kernels[0], 'device', 0)}", start_us=None,
                   dur_us=float(sum(x.duration for x in kernels)), launch_us=launch_us,
                   device_kernels=[x.name for x in kernels])  # fmt: skip
    return out


def _phase(name: str, label_phase: str) -> str:
    if name.startswith("autograd::engine::evaluate_function"):
        return "backward"
    if name.startswith("Optimizer."):
        return "optimizer"
    return label_phase


def graph_from_events(events: Iterable, uses_cuda: bool = False) -> list[dict]:
    """Profiler events (torch.profiler FunctionEvents) -> one op list per ``perf::step`` label."""
    events = sorted(events, key=lambda e: _span(e)[0])
    step_events = [e for e in events if e.name == STEP_LABEL]
    if not step_events:
        raise TraceError(f"no {STEP_LABEL!r} event in the profile")
    return [_one_step(events, st, uses_cuda) for st in step_events]


def _one_step(events: list, step, uses_cuda: bool) -> dict:
    s0, s1 = _span(step)
    inside = [e for e in events if s0 <= _span(e)[0] <= s1 and e is not step]
    labels = [e for e in inside if e.name.startswith(LABEL_PREFIX)]

    def label_phase(t: float) -> str:
        inner = [lab for lab in labels if _span(lab)[0] <= t <= _span(lab)[1]]
        if not inner:
            return "other"
        best = min(inner, key=lambda lab: _span(lab)[1] - _span(lab)[0])
        return best.name[len(LABEL_PREFIX) :]

    tops = []
    for e in inside:
        if e.name.startswith(LABEL_PREFIX) or e.name.startswith("cuda"):
            continue
        parent = e.cpu_parent
        if parent is None or parent.name.startswith(LABEL_PREFIX):
            tops.append(e)
    ops = []
    seen = set()
    for e in tops:
        a, b = _span(e)
        phase = _phase(e.name, label_phase(a))
        if phase == "other" and "forward" in seen and "backward" not in seen:
            phase = "loss"  # between the forward pass and backward: the loss
        seen.add(phase)
        found: list = []
        if is_compute(e.name):
            found = [e]
        else:
            _cpu_kernels(e, found)
            if not found and e.name not in METADATA_OPS and not _is_host_only(e.name):
                found = [e]
        kernels = [_cuda_kernel(k, s0) if uses_cuda else _cpu_kernel(k, s0) for k in found]
        if uses_cuda:  # device work the op launched outside the compute ops found in it
            whole = _cuda_kernel(e, s0)
            launched = [k for k in kernels if "device_kernels" in k]
            extra = len(whole.get("device_kernels", [])) - sum(
                len(k["device_kernels"]) for k in launched
            )
            if extra > 0:
                rest = whole["dur_us"] - sum(k["dur_us"] for k in launched)
                kernels.append({**whole, "dur_us": max(rest, 0.0), "launch_us": 0.0,
                                "device_kernels": ["(outside the compute ops)"] * extra})  # fmt: skip
        ops.append({
            "name": e.name, "phase": phase, "thread": int(e.thread), "start_us": a - s0,
            "dur_us": b - a, "n_events": _count(e), "shapes": _shapes(e),
            "dtypes": [str(d) for d in (e.input_dtypes or [])], "sync": _has_sync(e), "kernels": kernels,
        })  # fmt: skip
    _cat_outputs(ops)
    return {"dur_us": s1 - s0, "ops": ops}


def _cat_outputs(ops: list[dict]) -> None:
    """A cat's inputs are a TensorList, whose shapes the profiler does not record: when no
    narrow child gave its output shape, take the first input of the op that follows (what
    consumes the concatenation in DLRM's interaction and in the microbenchmarks)."""
    for i, op in enumerate(ops):
        for k in op["kernels"]:
            if k["name"] != "aten::cat" or k.get("out_shape"):
                continue
            for nxt in ops[i + 1 : i + 3]:
                if nxt["shapes"] and nxt["shapes"][0]:
                    k["out_shape"] = list(nxt["shapes"][0])
                    k["out_dtype"] = (nxt.get("dtypes") or ["float"])[0]
                    break


def _walk(e):
    yield e
    for c in e.cpu_children:
        yield from _walk(c)


# --- files ------------------------------------------------------------------------------------


def validate(doc: dict, where: str = "trace") -> dict:
    """Check a perf-trace document's shape; raise TraceError naming the first problem."""
    check_header(doc, where, format=FORMAT, versions=(VERSION,), kind="trace", error=TraceError)
    meta = doc.get("meta")
    if not isinstance(meta, dict) or not isinstance(meta.get("batch_size"), int):
        raise TraceError(f"{where}: meta.batch_size missing")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        raise TraceError(f"{where}: no steps")
    for i, st in enumerate(steps):
        if not isinstance(st.get("ops"), list) or not isinstance(st.get("dur_us"), (int, float)):
            raise TraceError(f"{where}: steps[{i}] needs ops and dur_us")
        for j, op in enumerate(st["ops"]):
            for key in ("name", "phase", "start_us", "dur_us", "kernels", "shapes"):
                if key not in op:
                    raise TraceError(f"{where}: steps[{i}].ops[{j}] has no {key}")
            if op["phase"] not in PHASES:
                raise TraceError(
                    f"{where}: steps[{i}].ops[{j}].phase {op['phase']!r} not in {PHASES}"
                )
            for k, kern in enumerate(op["kernels"]):
                for key in ("name", "stream", "dur_us"):
                    if key not in kern:
                        raise TraceError(f"{where}: steps[{i}].ops[{j}].kernels[{k}] has no {key}")
    return doc


def make_doc(meta: dict, steps: list[dict]) -> dict:
    return {"format": FORMAT, "version": VERSION, "meta": meta,
            "steps": [{"step": i, **s} for i, s in enumerate(steps)]}  # fmt: skip


def write_trace(doc: dict, path: str | Path) -> Path:
    validate(doc, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, doc, indent=None, separators=(",", ":"))
    return path


def read_trace(path: str | Path) -> dict:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    return validate(doc, str(path))


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files and directories (searched for *.trace.json) -> trace files."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.rglob("*.trace.json")))
        elif p.exists():
            out.append(p)
        else:
            raise TraceError(f"{p}: no such file or directory")
    return out
