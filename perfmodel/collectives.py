"""Collectives of a multi-process training step: what they send (counted) and what they should
cost (a latency-bandwidth model fitted on the running process group).

    with CollectiveCounter() as counter:                 # every rank, around some steps
        for _ in range(steps): pipeline.progress(batches)
    counter.per_step(steps)                              # bytes and calls by kind
    model = CollectiveModel.fit()                        # microbenchmarks on the same group
    model.predict_s(counter.records) / steps             # predicted seconds per step

Counting, not timing: on a shared, loaded machine the time of a collective swings with the
neighbours, its bytes do not. `CollectiveCounter` wraps torch.distributed's collectives for its
duration and records each call's payload (the bytes of this rank's input tensor) and wire bytes
(what this rank sends to the others: an all-to-all's input less its own split, a ring
all-reduce's 2 (W-1)/W of the payload), under a kind read from who called it:

- `ids_all_to_all`: torchrec's KJT all-to-all (lengths, values, splits of the sparse features);
- `pooled_all_to_all_fwd` / `_bwd`: pooled embeddings to the ranks that own the inputs, and
  their gradients back (torchrec's comm_ops);
- `all_reduce_replicated_tables`: the gradient buckets of data-parallel (replicated) tables
  (embeddings/sharded.py's DDP hook);
- `all_reduce_dense`: the dense part's DDP buckets (needs a Python comm hook on that DDP, e.g.
  `allreduce_hook`: DDP's built-in C++ reduction calls no Python);
- `all_reduce_loss`: the logged loss's mean over ranks (4 bytes); `all_reduce_other`, `other`:
  the rest.

The performance model of the step (perfmodel/model.py) has no collectives; `CollectiveModel` is
its communication part: per collective, time = latency + wire bytes / bandwidth (the alpha-beta
model), both fitted from timed collectives of a few sizes on the same process group.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

WRAPPED = ("all_to_all_single", "all_to_all", "all_reduce", "all_gather", "broadcast",
           "reduce_scatter", "reduce_scatter_tensor", "all_gather_into_tensor")  # fmt: skip
# (a function or class name on the caller's stack, the kind), first match wins
_KINDS = (
    ("_reduce_then_update", "all_reduce_replicated_tables"),
    ("mean_across_ranks", "all_reduce_loss"),
    ("KJTAllToAll", "ids_all_to_all"),
    ("SplitsAllToAll", "ids_all_to_all"),
    ("KJTOneToAll", "ids_all_to_all"),
    ("allreduce_hook", "all_reduce_dense"),
    ("Pooled", "pooled_all_to_all"),
    ("alltoall_pooled", "pooled_all_to_all"),
)


@dataclass
class Record:
    op: str  # the torch.distributed function
    kind: str
    payload_bytes: int
    wire_bytes: int


def _nbytes(t) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _kind(op: str) -> str:
    names, frame = [], sys._getframe(2)
    while frame is not None:
        names.append(frame.f_code.co_qualname)
        frame = frame.f_back
    for key, kind in _KINDS:  # in priority order: a hook may call another hook
        hits = [n for n in names if key in n]
        if hits:
            if kind == "pooled_all_to_all":
                return kind + ("_bwd" if any(n.endswith(".backward") for n in hits) else "_fwd")
            return kind
    return "all_reduce_other" if op == "all_reduce" else "other"


def _wire_bytes(op: str, args: tuple, kwargs: dict, world: int, rank: int) -> tuple[int, int]:
    """(payload, bytes sent to the other ranks) of one call."""
    if op == "all_to_all_single":
        inp = kwargs.get("input", args[1] if len(args) > 1 else None)
        splits = kwargs.get("input_split_sizes", args[3] if len(args) > 3 else None)
        payload = _nbytes(inp)
        if not splits:
            own = payload // world
        else:
            own = payload * splits[rank] // max(sum(splits), 1)
        return payload, payload - own
    if op == "all_to_all":
        inputs = kwargs.get("input_tensor_list", args[1] if len(args) > 1 else [])
        payload = _nbytes(inputs)
        return payload, payload - _nbytes(inputs[rank])
    tensor = args[0] if args else next(iter(kwargs.values()), None)
    if op in ("all_gather", "all_gather_into_tensor"):
        tensor = kwargs.get("tensor", args[1] if len(args) > 1 else tensor)
    payload = _nbytes(tensor)
    if op == "all_reduce":  # ring: reduce-scatter then all-gather
        return payload, 2 * (world - 1) * payload // world
    if op == "broadcast":
        return payload, payload if rank == kwargs.get("src", args[1] if len(args) > 1 else 0) else 0
    return payload, (world - 1) * payload // world


@dataclass
class CollectiveCounter:
    """Records every torch.distributed collective called inside `with`, on this rank."""

    records: list[Record] = field(default_factory=list)
    _saved: dict = field(default_factory=dict)

    def __enter__(self) -> CollectiveCounter:
        world, rank = dist.get_world_size(), dist.get_rank()
        for op in WRAPPED:
            original = getattr(dist, op)
            self._saved[op] = original

            def counted(*args, _op=op, _original=original, **kwargs):
                payload, wire = _wire_bytes(_op, args, kwargs, world, rank)
                self.records.append(Record(_op, _kind(_op), payload, wire))
                return _original(*args, **kwargs)

            setattr(dist, op, counted)
        return self

    def __exit__(self, *exc) -> None:
        for op, original in self._saved.items():
            setattr(dist, op, original)
        self._saved.clear()

    def per_step(self, steps: int) -> dict[str, dict]:
        """Per kind: calls, payload and wire bytes per step."""
        out: dict[str, dict] = {}
        for r in self.records:
            k = out.setdefault(r.kind, {"calls": 0, "payload_bytes": 0, "wire_bytes": 0})
            k["calls"] += 1
            k["payload_bytes"] += r.payload_bytes
            k["wire_bytes"] += r.wire_bytes
        return {
            kind: {name: value / steps for name, value in v.items()}
            for kind, v in sorted(out.items())
        }


@dataclass
class CollectiveModel:
    """Per collective op: seconds = latency_s + wire_bytes / bytes_per_s."""

    ops: dict[str, dict[str, float]]

    @classmethod
    def fit(
        cls, sizes: tuple[int, ...] = (1 << 8, 1 << 16, 1 << 20), reps: int = 15
    ) -> CollectiveModel:
        """Time all_reduce and all_to_all_single of `sizes` float32 elements on the default
        process group (every rank must call this), median of `reps`; least-squares line of
        time over wire bytes."""
        world, rank = dist.get_world_size(), dist.get_rank()
        ops: dict[str, dict[str, float]] = {}
        for op in ("all_reduce", "all_to_all_single"):
            points = []
            for n in sizes:
                n -= n % world
                x, y = torch.ones(n), torch.empty(n)

                def call(op=op, x=x, y=y) -> None:
                    if op == "all_reduce":
                        dist.all_reduce(x)
                    else:
                        dist.all_to_all_single(y, x)

                for _ in range(3):
                    call()
                times = []
                for _ in range(reps):
                    dist.barrier()
                    t0 = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t0)
                _, wire = _wire_bytes(op, (x, x) if op == "all_reduce" else (y, x), {}, world, rank)
                points.append((float(wire), statistics.median(times)))
            ops[op] = _line(points)
        ops["all_to_all"] = ops["all_to_all_single"]
        return cls(ops)

    def predict_s(self, records: list[Record]) -> float:
        """Predicted seconds of `records` (collectives without a fitted op are left out)."""
        total = 0.0
        for r in records:
            m = self.ops.get(r.op)
            if m is not None:
                total += m["latency_s"] + r.wire_bytes / m["bytes_per_s"]
        return total

    def as_dict(self) -> dict:
        return {op: dict(v) for op, v in self.ops.items()}


def _line(points: list[tuple[float, float]]) -> dict[str, float]:
    """Least-squares time = a + b * bytes (a, b >= 0): latency a, bandwidth 1 / b."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = max(sum((x - mx) * (y - my) for x, y in points) / sxx, 1e-15) if sxx else 1e-15
    a = max(my - b * mx, 0.0)
    return {"latency_s": a, "bytes_per_s": 1.0 / b, "points": len(points)}
