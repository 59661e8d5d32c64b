"""How steady is this machine right now? Prints JSON.

For `--seconds` it repeats, every 0.2 s: one training step of a small DLRM (batch 256), an fp32
384^3 matmul, a 2M-element gather and the perf model's canary (`hardware.canary_us`), each timed
by thread CPU time. Per series: the 10th percentile, the median and 90th percentile as multiples
of it, the share of samples more than 15% above it and the longest such run (in samples); and
the correlation of each series with the canary, the canary's median against the time it
took when the machine was described (`canary_slowdown_median`), and the share of the
machine's CPU time the hypervisor gave to other guests meanwhile (`steal_share`, from the
`steal` column of /proc/stat; 0.44 measured here in a slow hour). Run it before a
`python -m perfmodel` microbench/report cycle: on a shared VM the figures tell whether the
kernel timings can repeat.

    python scripts/host_noise.py --seconds 60
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def sample(seconds: float, pause_s: float = 0.2) -> tuple[dict[str, list[float]], float]:
    """The series, and the canary's time when the machine was described."""
    from perfmodel import hardware
    from perfmodel.fit_traces import base_config
    from perfmodel.graph import batches_for, build_trainer
    from perfmodel.profiling import run_steps
    from perfmodel.report import MLPS

    hw = hardware.describe()
    trainer = build_trainer(base_config(**MLPS["kaggle"], mini_batch_size=256))
    torch.set_num_threads(1)
    batches = batches_for(trainer, 256, 16)
    run_steps(trainer.pipeline, batches[:4])
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    src, idx = torch.randn(1 << 21), torch.randint(0, 1 << 21, (1 << 19,))

    def cpu_us(fn) -> float:
        t0 = time.thread_time()
        fn()
        return (time.thread_time() - t0) * 1e6

    out: dict[str, list[float]] = {"step": [], "gemm": [], "gather": [], "canary": []}
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        batch = batches[4 + i % 12]
        out["step"].append(cpu_us(lambda: run_steps(trainer.pipeline, [batch])))  # noqa: B023 - called at once
        out["gemm"].append(cpu_us(lambda: torch.mm(a, b)))
        out["gather"].append(cpu_us(lambda: torch.index_select(src, 0, idx)))
        out["canary"].append(hardware.canary_us())
        i += 1
        time.sleep(pause_s)
    return out, hw["canary_us"]


def cpu_times(stat: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, or None where /proc/stat has no steal column."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Stolen share of the CPU time that passed between two `cpu_times` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def summarize(
    series: dict[str, list[float]], described_canary_us: float | None = None, slow: float = 1.15
) -> dict:
    canary = np.asarray(series["canary"])
    result: dict = {"samples": len(canary)}
    if (
        described_canary_us
    ):  # how the canary compares with the machine's description (1.0 = as fast)
        result["canary_slowdown_median"] = round(float(np.median(canary)) / described_canary_us, 3)
    for name, values in series.items():
        x = np.asarray(values)
        p10 = float(np.percentile(x, 10))
        is_slow = x > slow * p10
        longest = run = 0
        for s in is_slow:
            run = run + 1 if s else 0
            longest = max(longest, run)
        result[name] = {
            "p10_us": round(p10, 1),
            "median_over_p10": round(float(np.median(x)) / p10, 3),
            "p90_over_p10": round(float(np.percentile(x, 90)) / p10, 3),
            "slow_share": round(float(is_slow.mean()), 3),
            "longest_slow_run": longest,
            "corr_with_canary": round(float(np.corrcoef(x, canary)[0, 1]), 3)
            if len(x) > 2
            else None,
        }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    before = cpu_times()
    result = summarize(*sample(args.seconds))
    result["steal_share"] = steal_share(before, cpu_times())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
