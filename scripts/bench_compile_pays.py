"""When does `--compile` pay for a bf16 run? Its cost (the compile, cold and from Inductor's
cache) against its gain (eager step time minus compiled step time), on this CPU.

    PYTHONPATH=$PWD python scripts/bench_compile_pays.py [--batch-sizes 128 2048] [--rounds 5]

Prints one JSON object: per batch size the compile's seconds (the first step minus a steady
step; cold: an empty Inductor cache, warm: the same graph again from the cache), the median
per-step time eager and compiled over interleaved rounds (adjacent measurements, so slow drifts
in machine load cancel) and the break-even run length `compile_s / gain_per_step_s`; the load
average and CPU flags beside them. dlrm/pipelines/compile.py's bf16 rule is derived from these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import cpu_flags, load_average  # noqa: E402

from dlrm import TrainConfig, Trainer  # noqa: E402
from hybrid_dlrm.common.machine import cpu_model  # noqa: E402


def make_trainer(batch_size: int, compile: bool, out: str) -> Trainer:
    """The default (Kaggle-shaped) architecture, small tables: the dense part is what compiles,
    and its cost does not depend on the tables."""
    cfg = TrainConfig(
        arch_embedding_size=tuple([1000] * 26), mini_batch_size=batch_size,
        data_size=batch_size * 100_000, test_data_size=batch_size, precision="bf16",
        compile=compile, out_dir=out, progress=False, print_freq=0,
    )  # fmt: skip
    return Trainer(cfg, checkpoints=False)


class Stepper:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.batches = trainer.data.train.batches(0)

    def step(self) -> float:
        t0 = time.perf_counter()
        self.trainer.pipeline.progress(self.batches)
        return time.perf_counter() - t0


def measure(batch_size: int, rounds: int, steps: int, tmp: str) -> dict:
    eager = Stepper(make_trainer(batch_size, False, f"{tmp}/e{batch_size}"))
    compiled = Stepper(make_trainer(batch_size, True, f"{tmp}/c{batch_size}"))
    first_eager = eager.step()
    first_compiled = compiled.step()  # the compile is inside this one
    per: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(rounds):
        for name, s in (("eager", eager), ("compiled", compiled)):
            s.step()  # not timed: the switch between the two
            per[name].append(statistics.median(s.step() for _ in range(steps)))
    again = Stepper(make_trainer(batch_size, True, f"{tmp}/w{batch_size}"))
    first_warm = again.step()  # the same graph, from Inductor's cache
    e, c = statistics.median(per["eager"]), statistics.median(per["compiled"])
    cold, warm = first_compiled - c, first_warm - c
    gain = e - c
    return {
        "eager_step_ms": round(e * 1e3, 3),
        "compiled_step_ms": round(c * 1e3, 3),
        "gain_per_step_ms": round(gain * 1e3, 3),
        "first_step_eager_s": round(first_eager, 3),
        "compile_cold_s": round(cold, 2),
        "compile_warm_s": round(warm, 2),
        "break_even_steps_cold": round(cold / gain) if gain > 0 else None,
        "break_even_steps_warm": round(warm / gain) if gain > 0 else None,
    }


def one(batch_size: int, rounds: int, steps: int) -> dict:
    """One batch size in a process of its own with an empty Inductor cache: the first compile
    is a user's first run (the graph is dynamic in the batch: a second size would hit the
    cache)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor")
        cmd = [sys.executable, __file__, "--one", str(batch_size), "--rounds", str(rounds),
               "--steps", str(steps), "--tmp", tmp]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        return json.loads(done.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 2048])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps per round and variant")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(measure(a.one, a.rounds, a.steps, a.tmp)))
        return
    import torch

    out = {"load_average_before": load_average(), "cpu_flags": cpu_flags(),
           "cpu": cpu_model(), "threads": torch.get_num_threads()}  # fmt: skip
    for bs in a.batch_sizes:
        out[str(bs)] = one(bs, a.rounds, a.steps)
    out["load_average_after"] = load_average()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
