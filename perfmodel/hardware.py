"""The hardware description: measured by short microbenchmarks at run time, cached per machine.

Nothing here comes from a datasheet. Per machine (CPU model, thread count, torch version and
CUDA device) one JSON file under ``~/.cache/hybrid-dlrm/`` (or ``HYBRID_DLRM_CACHE``) holds:

- ``matmul_gflops``: best sustained square-GEMM throughput per dtype (fp32, bf16);
- ``mem_bw_gbs``: copy bandwidth of a 128 MiB buffer (bytes read + written per second);
- ``read_bw_sweep``: read bandwidth per working-set size, 16 KiB .. 128 MiB, and
  ``llc_bytes_measured``, the largest working set still read at >= 60% of the in-cache speed;
  ``cache_bytes_os`` is what the OS reports at run time (sysfs), ``llc_bytes`` the value the
  embedding model uses (the OS figure when there is one, the sweep's otherwise);
- ``profiler_event_cost_us``: the thread-CPU time one recorded profiler event (with shapes)
  adds to a run, from a tiny op timed with and without the profiler (subtracted from traced
  overheads);
- on CUDA: ``cuda_sm_count``, ``cuda_memory_bytes``, ``cuda_l2_bytes``, ``cuda_matmul_tflops``
  per dtype (fp32, bf16, fp16; 8192^3 matmuls timed with CUDA events), ``cuda_mem_bw_gbs`` (a
  1 GiB device-to-device copy) and ``h2d_gbs``/``d2h_gbs`` (pinned copies of 64 MiB);
- ``canary_us``: the thread-CPU time of a fixed small workload (`canary_us()`), the machine's
  speed when it was described (``canary_bf16_us``: the same with bf16 matmuls). Measurements
  compare the canary before and after themselves with it (`slowdown`): on a VM that shares its
  host, thread-CPU time grows by 2-3x for minutes at a time while another tenant is busy, and a
  measurement taken then is of another machine.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from hybrid_dlrm.common.machine import cpu_flag_list, cpu_model  # noqa: F401  (cpu_model: benchmarks import it from here)
from perfmodel.machine_cache import cache_dir, machine_key

log = logging.getLogger(__name__)
VERSION = 1


def cpu_flags() -> list[str]:
    """The CPU's bf16/AMX/AVX-512 flags (what decides low-precision speed on this machine);
    benchmarks print them beside every bf16 figure."""
    return sorted(
        f for f in cpu_flag_list() if "bf16" in f or f.startswith("amx") or f == "avx512f"
    )


def has_bf16_units() -> bool:
    """avx512_bf16 or AMX: bf16 matrix products in hardware (elsewhere they are emulated)."""
    return any(f in ("avx512_bf16", "amx_bf16") for f in cpu_flags())


def default_path() -> Path:
    return cache_dir() / f"hardware-{machine_key()}.json"


def _best_time(fn, repeats: int = 5, min_s: float = 0.05) -> float:
    """Best per-call time over `repeats` timed loops of at least min_s each (medians hide less
    of the interference from other processes on a shared machine than minima do)."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_s or n >= 1 << 20:
            break
        n *= 2
    best = dt / n
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def matmul_gflops(dtype: torch.dtype, n: int = 1024) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    t = _best_time(lambda: torch.mm(a, b), repeats=3, min_s=0.1)
    return 2 * n**3 / t / 1e9


def canary_us(dtype: torch.dtype = torch.float32) -> float:
    """Best of 6 thread-CPU timings of a fixed workload: 8 256x256 matmuls and a 4 MiB copy
    (compute and memory; a few ms). The matmuls are fp32, or bf16 for the bf16 canary (best of
    3: bf16 matmuls run about 4x longer on a CPU without bf16 instructions), which tracks bf16
    GEMMs: measured here while a neighbour slowed fp32 GEMMs and the fp32 canary by 1.38-1.39x,
    a 2048x1024x1024 bf16 GEMM and the bf16 canary ran 1.04x and 1.07x slower."""
    a, b = torch.randn(256, 256).to(dtype), torch.randn(256, 256).to(dtype)
    src, dst = torch.randn(1 << 20), torch.empty(1 << 20)
    best = float("inf")
    for _ in range(6 if dtype == torch.float32 else 3):
        c0 = time.thread_time()
        for _ in range(8):
            torch.mm(a, b)
        dst.copy_(src)
        best = min(best, time.thread_time() - c0)
    return best * 1e6


def reference_canary_us(dtype: torch.dtype = torch.float32) -> float:
    """The canary as a hardware description keeps it: the best of three."""
    return min(canary_us(dtype) for _ in range(3))


def slowdown(hw: dict, dtype: torch.dtype = torch.float32) -> float:
    """How much slower the machine runs now than when `hw` was measured (1.0 = as fast), by the
    fp32 canary or, for bf16, the bf16 canary."""
    ref = hw.get("canary_us" if dtype == torch.float32 else "canary_bf16_us")
    return canary_us(dtype) / ref if ref else 1.0


SLOW_LIMIT = 1.15  # a measurement is retried when the canary ran more than this much slower


def on_steady_machine(
    fn, hw: dict, limit: float = SLOW_LIMIT, attempts: int = 8, pause_s: float = 15.0
):
    """fn() with the canary checked before and after: while the machine runs more than `limit`
    slower than described, wait and run again (at most `attempts` runs). Returns (fn's result,
    the worse of the two slowdowns of the run kept); the last attempt is kept whatever it is."""
    gate = SteadyGate(hw, limit, attempts, pause_s, wait_budget_s=float("inf"))
    result = gate.run(fn)
    return result, gate.slowdowns[-1]


class SteadyGate:
    """The canary around each short measurement (one microbenchmark draw, tens of milliseconds):
    this VM's neighbour comes and goes within seconds, so a long sweep checked only at its ends
    mixes fast and slow draws. A draw is retried after a short pause while the canary before or
    after it ran more than `limit` slower than described (at most `attempts` runs; the last is
    kept whatever it is). The pauses of one gate add up to at most `wait_budget_s`: in a long
    slow period the draws then run without waiting (and say so in `slowdowns`) instead of
    stretching a sweep into hours. `slowdowns` holds the worse canary of each kept draw."""

    def __init__(
        self, hw: dict, limit: float = SLOW_LIMIT, attempts: int = 4, pause_s: float = 1.0,
        wait_budget_s: float = 90.0,
    ) -> None:  # fmt: skip
        self.hw, self.limit, self.attempts, self.pause_s = hw, limit, attempts, pause_s
        self.wait_left = wait_budget_s
        self.slowdowns: list[float] = []
        self.retries = 0

    def run(self, fn):
        for attempt in range(1, self.attempts + 1):
            last = attempt == self.attempts or self.wait_left < self.pause_s
            worst = slowdown(self.hw)
            if worst <= self.limit or last:
                result = fn()
                worst = max(worst, slowdown(self.hw))
                if worst <= self.limit or last:
                    self.slowdowns.append(worst)
                    return result
            self.retries += 1
            self.wait_left -= self.pause_s
            # long waits (whole runs) are worth a line; a microbenchmark draw's second is not
            log.log(logging.INFO if self.pause_s >= 5 else logging.DEBUG,
                    "machine %.2fx slower than described: waiting %.0f s (attempt %d)",
                    worst, self.pause_s, attempt)  # fmt: skip
            time.sleep(self.pause_s)
        raise AssertionError("unreachable")

    def summary(self) -> dict:
        s = sorted(self.slowdowns) or [1.0]
        return {"draws": len(self.slowdowns), "retries": self.retries,
                "median_slowdown": round(statistics.median(s), 3), "max_slowdown": round(s[-1], 3),
                "slow_draws": sum(x > self.limit for x in s)}  # fmt: skip


def copy_bandwidth_gbs(nbytes: int = 128 << 20) -> float:
    a = torch.empty(nbytes // 4)
    a.fill_(1.0)
    b = torch.empty_like(a)
    t = _best_time(lambda: b.copy_(a), repeats=3, min_s=0.1)
    return 2 * nbytes / t / 1e9


def read_bandwidth_sweep() -> dict[int, float]:
    out = {}
    size = 16 << 10
    while size <= 128 << 20:
        a = torch.ones(size // 4)
        t = _best_time(a.sum, repeats=3, min_s=0.02)
        out[size] = size / t / 1e9
        size *= 2
    return out


def llc_from_sweep(sweep: dict[int, float]) -> int:
    """Largest working set read at >= 60% of the best in-cache speed (the last-level cache knee)."""
    sizes = sorted(sweep)
    fast = max(sweep[s] for s in sizes[: max(3, len(sizes) // 3)])
    inside = [s for s in sizes if sweep[s] >= 0.6 * fast]
    return max(inside) if inside else sizes[0]


def os_cache_bytes() -> dict[str, int]:
    out: dict[str, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        value = int(size.rstrip("KMG")) * mult
        out[f"L{level}{'' if kind == 'Unified' else kind[0].lower()}"] = value
    return out


_EVENT_COST: float | None = None


def profiler_event_cost_us(n: int = 2000) -> float:
    """Extra time one profiler event (with shapes) costs: a tiny op timed with and without."""
    global _EVENT_COST
    if _EVENT_COST is not None:
        return _EVENT_COST
    cached = _read_cache(default_path())
    if cached and "profiler_event_cost_us" in cached:
        _EVENT_COST = float(cached["profiler_event_cost_us"])
        return _EVENT_COST
    _EVENT_COST = measure_profiler_event_cost(n)
    return _EVENT_COST


def measure_profiler_event_cost(n: int = 2000) -> float:
    from torch.profiler import ProfilerActivity, profile

    x = torch.zeros(1)

    def loop() -> None:
        for _ in range(n):
            x.add_(1.0)

    costs = []
    for _ in range(5):
        c0 = time.thread_time()
        loop()
        plain = time.thread_time() - c0
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            c0 = time.thread_time()
            loop()
            prof = time.thread_time() - c0
        costs.append(max(0.0, (prof - plain) / n * 1e6))
    return statistics.median(costs)  # thread CPU time: other processes' time slices excluded


def measure(quick: bool = False) -> dict:
    """Run the hardware microbenchmarks (about 10 s on two cores; quick: about 2 s)."""
    t0 = time.perf_counter()
    desc: dict = {
        "version": VERSION,
        "key": machine_key(),
        "cpu_model": cpu_model(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        # a quick description (a calibration's, perfmodel/calibration.py) is measured again in
        # full by `python -m perfmodel microbench`
        "quick": quick,
    }
    n = 256 if quick else 1024
    desc["matmul_gflops"] = {
        "fp32": matmul_gflops(torch.float32, n),
        "bf16": matmul_gflops(torch.bfloat16, n),
    }
    desc["mem_bw_gbs"] = copy_bandwidth_gbs(16 << 20 if quick else 128 << 20)
    sweep = {} if quick else read_bandwidth_sweep()
    desc["read_bw_sweep"] = {str(k): v for k, v in sweep.items()}
    desc["llc_bytes_measured"] = llc_from_sweep(sweep) if sweep else None
    desc["cache_bytes_os"] = os_cache_bytes()
    llc = (
        max(desc["cache_bytes_os"].values(), default=0) or desc["llc_bytes_measured"] or (32 << 20)
    )
    desc["llc_bytes"] = int(llc)
    desc["profiler_event_cost_us"] = measure_profiler_event_cost(500 if quick else 2000)
    desc["canary_us"] = reference_canary_us()
    desc["canary_bf16_us"] = reference_canary_us(torch.bfloat16)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        desc["cuda_device"] = props.name
        desc["cuda_sm_count"] = props.multi_processor_count
        desc["cuda_memory_bytes"] = int(props.total_memory)
        desc["cuda_l2_bytes"] = int(getattr(props, "L2_cache_size", 0)) or None
        n = 1024 if quick else 8192
        desc["cuda_matmul_tflops"] = {name: cuda_matmul_tflops(dt, n) for name, dt in
                                      (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16))}  # fmt: skip
        desc["cuda_mem_bw_gbs"] = cuda_copy_bandwidth_gbs(64 << 20 if quick else 1 << 30)
        desc.update(_cuda_copy_bandwidth())
    desc["measure_s"] = time.perf_counter() - t0
    return desc


def cuda_event_seconds(fn, reps: int) -> list[float]:
    """Device seconds of each of `reps` calls of fn(), timed with CUDA events after a warm call."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def _cuda_time(fn, reps: int = 10) -> float:
    """Best device seconds of fn() over `reps` calls (`cuda_event_seconds`)."""
    return min(cuda_event_seconds(fn, reps))


def cuda_matmul_tflops(dtype: torch.dtype, n: int = 8192) -> float:
    """Peak matmul throughput of the CUDA device in a dtype (fp32 at the current TF32 setting)."""
    a = torch.randn(n, n, device="cuda").to(dtype)
    b = torch.randn(n, n, device="cuda").to(dtype)
    return 2 * n**3 / _cuda_time(lambda: torch.mm(a, b)) / 1e12


def cuda_copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device memory bandwidth: a device-to-device copy reads and writes `nbytes`."""
    a = torch.empty(nbytes // 4, device="cuda").fill_(1.0)
    b = torch.empty_like(a)
    return 2 * nbytes / _cuda_time(lambda: b.copy_(a)) / 1e9


def _cuda_copy_bandwidth(nbytes: int = 64 << 20) -> dict:
    host = torch.empty(nbytes // 4).pin_memory()
    dev = torch.empty(nbytes // 4, device="cuda")

    def h2d() -> None:
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()

    def d2h() -> None:
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()

    return {
        "h2d_gbs": nbytes / _best_time(h2d, 3, 0.05) / 1e9,
        "d2h_gbs": nbytes / _best_time(d2h, 3, 0.05) / 1e9,
    }


def describe_disk(directory: str | Path | None = None, refresh: bool = False) -> dict:
    """Random 4 KiB reads per queue depth on the file system of `directory` (the SSD tier's):
    perfmodel/disk.py, cached per machine and file system."""
    from perfmodel.disk import describe_disk as disk

    return disk(directory, refresh)


def _read_cache(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if data.get("version") == VERSION and data.get("key") == machine_key() else None


def describe(path: str | Path | None = None, refresh: bool = False, quick: bool = False) -> dict:
    """The cached description of this machine, measuring it first when absent or refresh."""
    path = Path(path) if path else default_path()
    if not refresh:
        cached = _read_cache(path)
        if cached is not None and "canary_bf16_us" not in cached:  # described before it existed
            cached["canary_bf16_us"] = reference_canary_us(torch.bfloat16)
            path.write_text(json.dumps(cached, indent=2) + "\n")
        if cached is not None:
            return cached
    desc = measure(quick=quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(desc, indent=2) + "\n")
    log.info("hardware description written to %s", path)
    return desc
