"""Checksum candidates for checkpoints and datasets on this CPU. Prints JSON.

    python scripts/bench_checksums.py [--mib 256] [--rounds 5]

Each candidate hashes one buffer (random bytes) in 16 MiB chunks, as `dlrm.checkpoints.format` does, on
one thread and on two; the candidates are interleaved round by round and the medians (with the
spread) reported in GB/s. `gil_released` compares a pure-Python counter's progress on the main
thread while a worker hashes against its progress alone: near 1.0 means the hash released the
GIL, near 0 (or far below 0.5 on a busy 2-core machine) means it held it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_CHUNK = 16 * 2**20


def candidates() -> dict[str, Callable[[np.ndarray], object]]:
    found: dict[str, Callable[[np.ndarray], object]] = {"zlib.crc32": zlib.crc32}
    optional = {
        "isal.crc32": ("isal.isal_zlib", "crc32"),
        "crc32c.crc32c": ("crc32c", "crc32c"),
        "google_crc32c.value": ("google_crc32c", "value"),
        "xxhash.xxh3_64": ("xxhash", "xxh3_64_intdigest"),
        "xxhash.xxh64": ("xxhash", "xxh64_intdigest"),
    }
    for name, (module, attr) in optional.items():
        try:
            found[name] = getattr(importlib.import_module(module), attr)
        except ImportError:
            pass
    return found


def rate(fn: Callable, chunks: list[np.ndarray], pool: ThreadPoolExecutor | None) -> float:
    t0 = time.perf_counter()
    if pool is None:
        for c in chunks:
            fn(c)
    else:
        list(pool.map(fn, chunks))
    return sum(len(c) for c in chunks) / (time.perf_counter() - t0) / 1e9


def gil_released(fn: Callable, data: np.ndarray) -> float:
    """Python-loop progress on the main thread while another hashes `data`, relative to alone."""

    def count(seconds: float, stop: threading.Event | None = None) -> float:
        n, t0 = 0, time.perf_counter()
        while (stop is None or not stop.is_set()) and time.perf_counter() - t0 < seconds:
            n += 1
        return n / (time.perf_counter() - t0)

    alone = count(0.2)
    stop = threading.Event()
    seconds = 0.0

    def work() -> None:
        nonlocal seconds
        t0 = time.perf_counter()
        for _ in range(4):
            fn(data)
        seconds = time.perf_counter() - t0
        stop.set()

    worker = threading.Thread(target=work)
    worker.start()
    during = count(30.0, stop)
    worker.join()
    return during / alone


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    data = np.random.default_rng(0).integers(0, 256, args.mib * 2**20, dtype=np.uint8)
    chunks = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)]  # as checkpoints do
    fns = candidates()
    rates: dict[str, dict[str, list[float]]] = {n: {"1": [], "2": []} for n in fns}
    with ThreadPoolExecutor(2) as pool:
        for fn in fns.values():  # warm up (page faults, lazy init)
            rate(fn, chunks, None)
        for _ in range(args.rounds):
            for name, fn in fns.items():
                rates[name]["1"].append(rate(fn, chunks, None))
                rates[name]["2"].append(rate(fn, chunks, pool))
    flags = open("/proc/cpuinfo").read().split("flags")[1].splitlines()[0].split()
    report = {
        "buffer_mib": args.mib,
        "rounds": args.rounds,
        "cpu_flags": sorted(f for f in flags if f in {"sse4_2", "pclmulqdq", "vpclmulqdq"})
        + sorted(f for f in flags if f.startswith(("avx512_bf16", "amx"))),
        "load_avg": os.getloadavg(),
        "gb_per_s": {
            name: {
                f"{t}_thread{'s' if t == '2' else ''}": {
                    "median": round(statistics.median(v), 2),
                    "min": round(min(v), 2),
                    "max": round(max(v), 2),
                }
                for t, v in r.items()
            }
            for name, r in rates.items()
        },
        "gil_released": {name: round(gil_released(fn, data), 2) for name, fn in fns.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
