"""The critical-path traversal: per-batch time from an execution graph without running it.

Walk the step's top-level ops in order with a host clock and one device clock per stream:

    host += T1 (gap before the op) + T2 (op start to first kernel)
    for each kernel:  host += T5 (between kernels, not before the first) + T4 (launch)
                      start = max(host, device[stream]);  device[stream] = start + kernel time
                      on a CPU stream the call is synchronous: host = device[stream]
    host += T3 (last kernel to op end)
    if the op synchronises (item(), a blocking copy): host = max(host, every device clock)

The per-batch time is the later of the host clock and every device clock after the last op
(plus the step's tail overhead). Device active time is the sum of kernel times per stream.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from perfmodel.features import op_type
from perfmodel.overheads import KINDS


def traverse(ops: list[dict], kernel_time: Callable[[dict], float], overhead: Callable[[dict, str], float],
             step_end_us: float = 0.0) -> dict:  # fmt: skip
    """`kernel_time(kernel)` and `overhead(op, kind)` in microseconds -> prediction and breakdown."""
    host = 0.0
    device: dict[str, float] = defaultdict(float)
    active: dict[str, float] = defaultdict(float)
    by_phase: dict[str, float] = defaultdict(float)
    by_type: dict[str, float] = defaultdict(float)
    by_kind: dict[str, float] = {k: 0.0 for k in KINDS}

    def host_spend(op: dict, kind: str) -> None:
        nonlocal host
        dt = overhead(op, kind)
        host += dt
        by_kind[kind] += dt
        by_phase[op.get("phase", "other")] += dt

    for op in ops:
        host_spend(op, "T1")
        host_spend(op, "T2")
        for i, k in enumerate(op.get("kernels", [])):
            if i:
                host_spend(op, "T5")
            host_spend(op, "T4")
            t = float(kernel_time(k))
            stream = k.get("stream", "cpu")
            start = max(host, device[stream])
            device[stream] = start + t
            active[stream] += t
            by_type[op_type(k["name"])] += t
            by_phase[op.get("phase", "other")] += t
            if stream == "cpu":
                host = device[stream]
        host_spend(op, "T3")
        if op.get("sync"):
            host = max([host, *device.values()])
    host += step_end_us
    total = max([host, *device.values()])
    return {
        "per_batch_us": total,
        "host_us": host,
        "device_active_us": dict(active),
        "device_active_total_us": sum(active.values()),
        "breakdown": {
            "phase_us": dict(by_phase),
            "kernel_type_us": dict(by_type),
            "overhead_us": by_kind,
            "step_end_us": step_end_us,
        },  # fmt: skip
    }
