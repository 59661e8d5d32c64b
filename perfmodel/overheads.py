"""The five host-side overheads of Lin et al. (2022), measured from perf traces.

On a GPU they are: T1, the gap between consecutive top-level operators; T2, from an operator's
start to its first kernel launch; T3, from its last launch to its end; T4, the launch call
itself (cudaLaunchKernel); T5, the gaps between launches within one operator.

On CPU nothing is launched: a "kernel" is the outermost compute operator inside a top-level op,
run synchronously on the calling thread (see `perfmodel.trace`). The kinds map as:

- T1: Python and framework time between top-level operators (the trainer's code, module
  ``__call__`` and hooks, autograd engine bookkeeping between nodes);
- T2: dispatch of the top-level op before its first compute op (the autocast and
  ``aten::linear`` wrappers, argument checks, allocations of the output);
- T3: after the last compute op until the op returns (wrapping results, autograd graph
  recording);
- T4: zero on CPU by construction (a synchronous call has no launch; its dispatch is in T2/T5);
- T5: dispatch between consecutive compute ops of one top-level op (e.g. the casts of autocast
  before an ``addmm``, the two ``mm`` of an ``AddmmBackward0``).

On CUDA a kernel record is the op's device work (see `perfmodel.trace`), which has no place
in the op's host span: T4 holds its launch calls and T2 the rest of the op's host time (T3 and
T5 come from the ops that ran on the host). An op that does no compute (views, AccumulateGrad)
is all host time; it is stored as T2 with no kernels. Statistics are mean/std/count/median per op key (name plus the names of its kernels, so an
autocast ``aten::linear`` and an fp32 one are separate) with a per-name and a global fallback.

A step that moves more spends longer in the same ops' host spans (allocating and freeing larger
tensors, page faults on fresh ones): a fit step's overheads were 2.2 ms at batch 128 and 7.0 ms at
the wide MLP's batch 3072. Each entry therefore also keeps the medians per fit step with that
step's dense working set (`features.step_dense_bytes`), and a prediction reads the fit steps
nearest its own (held-out, small MLP at batch 128: +20-28% end to end with the pooled medians,
+3-6% with these).

The profiler itself costs ``profiler_event_cost_us`` per recorded event; a trace's overheads
are corrected by subtracting that cost for the events inside each span (the op's events that are
not kernels), so that the statistics describe an unprofiled run.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import numpy as np

from perfmodel.features import step_dense_bytes, step_weights

KINDS = ("T1", "T2", "T3", "T4", "T5")


def op_key(op: dict) -> str:
    return op["name"] + "|" + ",".join(k["name"] for k in op.get("kernels", []))


class _Acc:
    __slots__ = ("xs",)

    def __init__(self) -> None:
        self.xs: list[float] = []

    def add(self, x: float) -> None:
        self.xs.append(x)

    def stats(self) -> dict:
        n = len(self.xs)
        mean = sum(self.xs) / n if n else 0.0
        var = sum((x - mean) ** 2 for x in self.xs) / n if n else 0.0
        return {
            "mean": mean,
            "std": math.sqrt(var),
            "count": n,
            "median": statistics.median(self.xs) if n else 0.0,
        }


def op_overheads(op: dict, prev_end: float | None, event_cost: float) -> dict[str, list[float]]:
    """The overhead samples of one traced op (lists, since T4/T5 occur once per kernel/gap)."""
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    start, end = op["start_us"], op["start_us"] + op["dur_us"]
    if prev_end is not None:
        out["T1"].append(max(start - prev_end - event_cost, 0.0))  # the op's own event entry
    kernels = [k for k in op.get("kernels", []) if k.get("start_us") is not None]
    # CUDA kernels run on the device, not inside the op's host span: the op's host time is its
    # launch calls (T4) and the rest (T2)
    launched = [k for k in op.get("kernels", []) if k.get("start_us") is None]
    launch_us = [float(k.get("launch_us", 0.0)) for k in launched]
    out["T4"].extend(launch_us)
    if not kernels:
        out["T2"].append(
            max(op["dur_us"] - sum(launch_us) - event_cost * op.get("n_events", 1), 0.0)
        )
        return out
    host_events = max(op.get("n_events", 1) - sum(k.get("n_events", 1) for k in kernels), 0)
    t2 = kernels[0]["start_us"] - start
    t3 = end - (kernels[-1]["start_us"] + kernels[-1]["dur_us"])
    gaps = [b["start_us"] - (a["start_us"] + a["dur_us"]) for a, b in zip(kernels, kernels[1:])]
    raw = max(t2, 0) + max(t3, 0) + sum(max(g, 0) for g in gaps)
    # spread the profiler's cost over the host spans in proportion to their length
    keep = max(raw - event_cost * host_events, 0.0) / raw if raw > 0 else 1.0
    out["T2"].append(max(t2, 0) * keep)
    out["T3"].append(max(t3, 0) * keep)
    out["T4"].extend(float(k.get("launch_us", 0.0)) for k in kernels)
    out["T5"].extend(max(g, 0) * keep for g in gaps)
    return out


def _at_step(entry: dict, step_bytes: float | None) -> float:
    """An entry's overhead at a step's dense working set: the mean of the fit steps' medians,
    weighted by `features.step_weights`; the pooled median without a step."""
    points = entry.get("by_step")
    if not step_bytes or not points:
        return entry.get("median", entry["mean"])
    pts = np.asarray(points, dtype=np.float64)
    w = step_weights(pts[:, 0], step_bytes)
    return float(w @ pts[:, 1] / w.sum())


class Overheads:
    def __init__(self, table: dict | None = None) -> None:
        self.table: dict[str, dict[str, dict]] = table or {}

    @classmethod
    def from_traces(cls, docs: list[dict], event_cost: float | None = None) -> Overheads:
        """Statistics over every step of the traces; `event_cost` overrides the traces' own
        profiler cost per event (the fit calibrates it against unprofiled step times).

        Each entry also keeps, per trace and step variant, the median of its samples there with
        the log of that step's dense working set (``by_step``: ``[log step bytes, median,
        count]``), which `get` reads at a predicted step's working set."""
        accs: dict[str, dict[str, _Acc]] = defaultdict(lambda: defaultdict(_Acc))
        by_step: dict[tuple[str, str], list[list[float]]] = defaultdict(list)
        for doc in docs:
            cost = (
                float(doc["meta"].get("profiler_event_cost_us") or 0.0)
                if event_cost is None
                else event_cost
            )
            # this trace's samples per step variant (its log dense working set) and (key, kind)
            local: dict[float, dict[tuple[str, str], _Acc]] = {}
            for step in doc["steps"]:
                size = step_dense_bytes(k for op in step["ops"] for k in op.get("kernels", []))
                here = local.setdefault(round(math.log(max(size, 1.0)), 6), defaultdict(_Acc))
                prev_end: dict[int, float] = {}
                for op in step["ops"]:
                    thread = op.get("thread", 0)
                    samples = op_overheads(op, prev_end.get(thread, 0.0), cost)
                    prev_end[thread] = op["start_us"] + op["dur_us"]
                    for key in (op_key(op), op["name"], "*"):
                        for kind, xs in samples.items():
                            for x in xs:
                                accs[key][kind].add(x)
                                here[key, kind].add(x)
                # the tail of the step after its last op (the trainer's return path)
                if step["ops"]:
                    last = max(o["start_us"] + o["dur_us"] for o in step["ops"])
                    tail = max(step["dur_us"] - last, 0.0)
                    accs["<step_end>"]["T1"].add(tail)
                    here["<step_end>", "T1"].add(tail)
            for log_size, accs_here in local.items():
                for (key, kind), acc in accs_here.items():
                    stats = acc.stats()
                    by_step[key, kind].append([log_size, stats["median"], stats["count"]])
        table = {
            key: {kind: acc.stats() for kind, acc in kinds.items()} for key, kinds in accs.items()
        }
        for (key, kind), points in by_step.items():
            table[key][kind]["by_step"] = points
        return cls(table)

    def get(self, op: dict, kind: str, step_bytes: float | None = None) -> float:
        """The expected overhead of this kind for op: the median of its samples (robust to the
        preemptions of a shared machine), by op key, else by name, else over all ops. With
        `step_bytes` (the predicted step's dense working set), the medians of the fit steps
        nearest it (`_at_step`)."""
        for key in (op_key(op), op["name"], "*"):
            entry = self.table.get(key, {}).get(kind)
            if entry and entry["count"]:
                return _at_step(entry, step_bytes)
        return 0.0

    def step_end(self, step_bytes: float | None = None) -> float:
        entry = self.table.get("<step_end>", {}).get("T1")
        return _at_step(entry, step_bytes) if entry else 0.0

    def to_json(self) -> dict:
        return {"kinds": list(KINDS), "table": self.table}

    @classmethod
    def from_json(cls, data: dict) -> Overheads:
        return cls(data["table"])
