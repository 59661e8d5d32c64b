"""A training run beside busy neighbours: does it keep its fair share of a shared machine?

Runs a small `python -m dlrm.train` (the issue's: `--data-size 65536 --test-data-size 4096
--mini-batch-size 512`) alone, then beside one and two CPU-bound neighbours (a busy-loop Python
process each, started and killed here), in interleaved rounds: every round runs every variant
under every load, in a rotated order, so slow changes in the machine's other load spread over
all of them. Variants (`--variants`):

- `old`: the behaviour before the thread choice: 2 threads whatever the load, libgomp's default
  wait (it spins about 300,000 times before sleeping: GOMP_SPINCOUNT=300000, its default value);
- `new`: the defaults as they are (`--threads` auto: the count follows the load,
  dlrm/processes/thread_watch.py);
- `one`: `--threads 1`;
- exploratory: `passive2` (2 threads, OMP_WAIT_POLICY=PASSIVE: the default of 2026-11-25),
  `spin3k`/`spin10k`/`spin30k`/`spin100k` (2 threads, GOMP_SPINCOUNT=3000 ...), `active2` (2 threads, OMP_WAIT_POLICY=ACTIVE), `workqueue` (the
  defaults with numba's workqueue threading layer instead of OpenMP).

Prints one JSON object: per load and variant the median samples/s (the run's own
`train_samples_per_s`), the spread ((max - min) / median) and every sample; the ratios
`new/one`, `old/one`, `new/old` per load (medians of per-round ratios); the issue's targets
(beside one neighbour: new >= 0.8x one; alone on a quiet machine: new within 3% of old, where
"quiet" is counted, not assumed: the CPUs other processes kept busy during the runs without
neighbours, from /proc/stat less the runs' own CPU time, below 0.3); the CPU model and flags,
this process's affinity and cgroup quota, and the load average before and after (this machine
may be shared: a load above the neighbours' count says someone else was running too).

    python scripts/bench_contention.py                    # 3 rounds, about 15-30 minutes
    python scripts/bench_contention.py --rounds 1 --data-size 16384 --neighbours 0,1
    python scripts/bench_contention.py --variants old,passive2,spin10k,one,workqueue
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dlrm.processes import threads  # noqa: E402  (no torch: the children start their own OpenMP runtime)
from dlrm.processes.thread_watch import CpuSampler  # noqa: E402
from hybrid_dlrm.common.machine import cpu_flag_list, cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# name -> (flags, environment); every variant starts from an environment without any of these
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "old": (["--threads", "2"], {"GOMP_SPINCOUNT": "300000"}),
    "new": ([], {}),
    "one": (["--threads", "1"], {}),
    "passive2": (["--threads", "2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "spin3k": (["--threads", "2"], {"GOMP_SPINCOUNT": "3000"}),
    "spin10k": (["--threads", "2"], {"GOMP_SPINCOUNT": "10000"}),
    "spin30k": (["--threads", "2"], {"GOMP_SPINCOUNT": "30000"}),
    "spin100k": (["--threads", "2"], {"GOMP_SPINCOUNT": "100000"}),
    "active2": (["--threads", "2"], {"OMP_WAIT_POLICY": "ACTIVE"}),
    "workqueue": ([], {"NUMBA_THREADING_LAYER": "workqueue"}),
}
CLEARED = (*threads.WAIT_VARIABLES, "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
           "NUMBA_THREADING_LAYER")  # fmt: skip
BUSY = "while True: pass"


def cpu_flags() -> list[str]:
    """The vector flags that decide this step's speed."""
    return sorted(f for f in cpu_flag_list() if f.startswith(("avx", "amx", "fma")))


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_once(variant: str, args: argparse.Namespace, out_dir: Path) -> dict:
    flags, extra = VARIANTS[variant]
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(extra, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "dlrm.train", "--data-size", str(args.data_size),
           "--test-data-size", str(args.test_data_size), "--mini-batch-size",
           str(args.mini_batch_size), "--progress", "false", "--out-dir", str(out_dir), *flags]  # fmt: skip
    sampler = CpuSampler()
    before, kids0 = sampler.read(), _children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after, kids1 = sampler.read(), _children_cpu()
    # the run and the neighbours are children of this process: their CPU is not "others"
    if done.returncode != 0:
        raise SystemExit(f"bench_contention: {variant} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out_dir / "summary.json").read_text())
    first = done.stdout.splitlines()[0] if done.stdout else ""
    others = None
    if before is not None and after is not None:
        ours = (after.own - before.own) + (kids1 - kids0)
        others = max(0.0, ((after.busy - before.busy) - ours) / (after.wall - before.wall))
    return {"samples_per_s": summary["train_samples_per_s"], "process_s": wall, "line": first,
            "others_busy_cpus": others}  # fmt: skip


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def command(args: argparse.Namespace) -> str:
    return (f"python -m dlrm.train --data-size {args.data_size} --test-data-size "
            f"{args.test_data_size} --mini-batch-size {args.mini_batch_size}")  # fmt: skip


def neighbours(n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    time.sleep(1.0)  # let the scheduler see them busy
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def main() -> None:
    # a kill ends the neighbours too (the finally below; subprocess.run kills its child)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default="old,new,one")
    p.add_argument(
        "--neighbours", default="0,1,2", help="the loads: busy neighbours beside the run"
    )
    p.add_argument("--data-size", type=int, default=65536)
    p.add_argument("--test-data-size", type=int, default=4096)
    p.add_argument("--mini-batch-size", type=int, default=512)
    args = p.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or args.rounds < 1:
        p.error(f"--variants: expected some of {', '.join(VARIANTS)}, got {unknown}"
                if unknown else "--rounds: expected a positive integer")  # fmt: skip
    loads = [int(x) for x in args.neighbours.split(",")]
    samples: dict[int, dict[str, list[float]]] = {n: {v: [] for v in variants} for n in loads}
    lines: dict[str, str] = {}
    busy: dict[int, list[float]] = {n: [] for n in loads}  # CPUs others kept busy per run
    load_before, t0 = load_average(), time.time()
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as tmp:
        k = 0
        for r in range(args.rounds):
            for n in loads:
                procs = neighbours(n)
                try:
                    order = variants[r % len(variants) :] + variants[: r % len(variants)]
                    for v in order:
                        res = run_once(v, args, Path(tmp) / f"run{k}")
                        k += 1
                        samples[n][v].append(res["samples_per_s"])
                        if res["others_busy_cpus"] is not None:
                            busy[n].append(res["others_busy_cpus"])
                        lines.setdefault(v, res["line"])
                        print(f"round {r} neighbours {n} {v}: {res['samples_per_s']:.0f} samples/s "
                              f"(process {res['process_s']:.1f} s, load {load_average()[0]})",
                              file=sys.stderr, flush=True)  # fmt: skip
                finally:
                    stop(procs)
    results, ratios = {}, {}
    for n in loads:
        results[f"neighbours_{n}"] = {
            v: {
                "median": round(statistics.median(s)),
                "spread": round((max(s) - min(s)) / statistics.median(s), 3),
                "samples": [round(x) for x in s],
            }
            for v, s in samples[n].items()
        }
        ratios[f"neighbours_{n}"] = {
            f"{a}/{b}": round(statistics.median(x / y for x, y in zip(samples[n][a], samples[n][b])), 3)
            for a, b in (("new", "one"), ("old", "one"), ("new", "old"))
            if a in variants and b in variants
        }  # fmt: skip
    targets = {}
    if {"new", "one"} <= set(variants) and 1 in loads:
        x = ratios["neighbours_1"]["new/one"]
        targets["beside one neighbour: new >= 0.8x one"] = {"ratio": x, "met": x >= 0.8}
    if {"new", "old"} <= set(variants) and 0 in loads:
        x = ratios["neighbours_0"]["new/old"]
        others = statistics.median(busy[0]) if busy[0] else None
        quiet = others is not None and others < 0.3  # else "alone" was beside others
        targets["alone, quiet: new within 3% of old"] = {
            "ratio": x, "others_busy_cpus": others,
            "met": x >= 0.97 if quiet else "not measurable: the machine was not quiet",
        }  # fmt: skip
    print(json.dumps({
        "command": command(args),
        "variants": {v: {"flags": VARIANTS[v][0], "env": VARIANTS[v][1], "start_line": lines.get(v)}
                     for v in variants},
        "rounds": args.rounds,
        "results": results,
        "ratios": ratios,
        "others_busy_cpus": {f"neighbours_{n}": [round(x, 2) for x in b] for n, b in busy.items()},
        "targets": targets,
        "machine": {"cpu_model": cpu_model(), "cpu_flags": cpu_flags(), "cpus": os.cpu_count(),
                    "affinity": len(os.sched_getaffinity(0)), "cgroup_quota": threads.cpu_quota()},
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "minutes": round((time.time() - t0) / 60, 1),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
