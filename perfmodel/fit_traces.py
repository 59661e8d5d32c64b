"""The fit configurations: short training runs whose perf traces give the overhead statistics
and the in-situ factors (`KernelModels.calibrate_in_situ`), their kernels joining the samples.

Each is traced on a steady machine (`hardware.on_steady_machine`); one kept slow after its
canary checks is measured again after the others (`fit_traces`).
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from pathlib import Path

import torch

from hybrid_dlrm.common.atomic import publish
from perfmodel import hardware
from perfmodel import trace as tr

log = logging.getLogger(__name__)

# Fit configurations: their traces give the overhead statistics and the in-situ factors. None of
# them is a report configuration (different MLP shapes and batch sizes).
FIT_CONFIGS = [
    {
        "arch_mlp_bot": (13, 256, 64, 16),
        "arch_mlp_top": (256, 64, 1),
        "mini_batch_size": 384,
        "precision": "fp32",
    },
    {
        "arch_mlp_bot": (13, 256, 64, 16),
        "arch_mlp_top": (256, 64, 1),
        "mini_batch_size": 1536,
        "precision": "bf16",
    },
    {
        "arch_mlp_bot": (13, 96, 16),
        "arch_mlp_top": (384, 1),
        "mini_batch_size": 768,
        "precision": "bf16",
    },
    {
        "arch_mlp_bot": (13, 96, 16),
        "arch_mlp_top": (384, 1),
        "mini_batch_size": 3072,
        "precision": "fp32",
    },
    {  # wide layers (about 0.6M dense parameters): kernels at the sizes of the big MLPs
        "arch_mlp_bot": (13, 768, 16),
        "arch_mlp_top": (768, 384, 1),
        "mini_batch_size": 1536,
        "precision": "fp32",
    },
    {
        "arch_mlp_bot": (13, 768, 16),
        "arch_mlp_top": (768, 384, 1),
        "mini_batch_size": 384,
        "precision": "bf16",
    },
    {  # FAE: the hot/cold split, the device tier's updates and the syncs
        "arch_mlp_bot": (13, 256, 64, 16),
        "arch_mlp_top": (256, 64, 1),
        "mini_batch_size": 768,
        "precision": "fp32",
        "placement": "fae",
        "hot_budget": "2MB",
        "fae_switch_period": 8,
    },
    {  # FAE at another batch and precision: the device tier's row scatters grow with the
        # unique rows a batch touches, and their in-situ factor with it (one FAE trace gave
        # one point: held-out scatter kernels 17-25% off; with this one, 16%)
        "arch_mlp_bot": (13, 96, 16),
        "arch_mlp_top": (384, 1),
        "mini_batch_size": 3072,
        "precision": "bf16",
        "placement": "fae",
        "hot_budget": "2MB",
        "fae_switch_period": 8,
    },
    # Steps that span the held-out ones' dense working sets (`features.step_dense_bytes`, on
    # which in-situ factors depend): small batches (about 10-40 MB) and a wide, large one
    # (about 390 MB). No fit trace shares a batch size with a held-out configuration, so no
    # held-out kernel (the embedding lookups and the loss depend on the batch only) has been
    # timed in a fit step
    {"arch_mlp_bot": (13, 256, 64, 16), "arch_mlp_top": (256, 64, 1), "mini_batch_size": 96,
     "precision": "fp32"},
    {"arch_mlp_bot": (13, 96, 16), "arch_mlp_top": (384, 1), "mini_batch_size": 192,
     "precision": "bf16"},
    {"arch_mlp_bot": (13, 768, 16), "arch_mlp_top": (768, 384, 1), "mini_batch_size": 192,
     "precision": "fp32"},
    {"arch_mlp_bot": (13, 768, 16), "arch_mlp_top": (768, 384, 1), "mini_batch_size": 3072,
     "precision": "fp32"},
    # more FAE steps: the device tier's row scatters over batch 320-2560 (with two FAE traces
    # the held-out scatter kernels were 12-16% off; with five, 9-10%)
    {"arch_mlp_bot": (13, 256, 64, 16), "arch_mlp_top": (256, 64, 1), "mini_batch_size": 320,
     "precision": "bf16", "placement": "fae", "hot_budget": "2MB", "fae_switch_period": 8},
    {"arch_mlp_bot": (13, 96, 16), "arch_mlp_top": (384, 1), "mini_batch_size": 1536,
     "precision": "fp32", "placement": "fae", "hot_budget": "2MB", "fae_switch_period": 8},
    {"arch_mlp_bot": (13, 256, 64, 16), "arch_mlp_top": (256, 64, 1), "mini_batch_size": 2560,
     "precision": "fp32", "placement": "fae", "hot_budget": "2MB", "fae_switch_period": 8},
]  # fmt: skip


def base_config(**changes):
    from dlrm.config import TrainConfig

    base = {"synthetic_table_scale": 0.01, "data_size": 1 << 20, "test_data_size": 1024, "print_freq": 0,
            "out_dir": "/tmp/perfmodel-unused"}  # fmt: skip
    base.update(changes)
    return TrainConfig(**base)


def trace_config(
    cfg, out: Path, warmup: int = 3, steps: int = 3, timed: int = 11
) -> tuple[Path, float]:
    """Record a perf trace of `steps` steps of cfg (after warm-up) with batches made up front,
    on a steady machine (see `hardware.on_steady_machine`). Returns the trace's path and the
    machine's slowdown while it was measured."""
    from perfmodel.graph import batches_for, build_trainer
    from perfmodel.profiling import trace_meta

    threads = torch.get_num_threads()
    trainer = build_trainer(cfg)
    bs = batches_for(trainer, cfg.training.mini_batch_size, warmup + timed + steps)
    torch.set_num_threads(threads)
    wall, cpu, graphs, slow = measure_steps(
        trainer, bs[:warmup], bs[warmup : warmup + timed], bs[warmup + timed :]
    )
    meta = trace_meta(trainer, cfg.training.mini_batch_size)
    meta["unprofiled_step_us"], meta["unprofiled_step_cpu_us"] = wall, cpu
    meta["machine_slowdown"] = slow
    log.info("fit trace %s: machine slowdown %.2f", out.name, slow)
    return tr.write_trace(tr.make_doc(meta, graphs), out), slow


def fit_traces(traces_dir: Path, threads: int, count: int | None = None) -> list[float]:
    """The fit configurations' traces, ``fit<i>.trace.json``. A trace still measured on a slow
    machine after its canary checks is measured once more after all the others (minutes later,
    when the neighbour may have gone) and the steadier of the two is kept: the in-situ factors
    come from the steady traces (`KernelModels.calibrate_in_situ`). Returns each kept trace's
    slowdown. `count`: the first configurations only (the docs' walk)."""
    configs = FIT_CONFIGS[:count]
    slowdowns = []
    for i, changes in enumerate(configs):
        t0 = time.perf_counter()
        _, slow = trace_config(base_config(**changes), traces_dir / f"fit{i}.trace.json")
        torch.set_num_threads(threads)
        slowdowns.append(slow)
        print(f"microbench: fit trace {i + 1}/{len(configs)} in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    for i, changes in enumerate(configs):
        if slowdowns[i] <= hardware.SLOW_LIMIT:
            continue
        retry, again = trace_config(base_config(**changes), traces_dir / f"fit{i}.retry")
        torch.set_num_threads(threads)
        if again < slowdowns[i]:
            publish(retry, traces_dir / f"fit{i}.trace.json")
            slowdowns[i] = again
        else:
            retry.unlink()
    return slowdowns


def measure_steps(trainer, warm: list, timed: list, profiled: list, agg=statistics.median):
    """Warm-up steps, then `timed` plain steps and `profiled` profiled ones, all on a steady
    machine (see `hardware.on_steady_machine`). Returns (wall us, thread-CPU us, each `agg` over
    the timed steps; the profiled steps' graphs; the machine's slowdown)."""
    from perfmodel.profiling import profile_steps, run_steps

    def run():
        run_steps(trainer.pipeline, warm)
        wall, cpu = time_steps(trainer, timed, agg)
        graphs = profile_steps(trainer.pipeline, profiled, trainer.device.type == "cuda")
        return wall, cpu, graphs

    (wall, cpu, graphs), slow = hardware.on_steady_machine(run, hardware.describe())
    return wall, cpu, graphs, slow


def time_steps(trainer, batches: list, agg=statistics.median) -> tuple[float, float]:
    """Wall and thread-CPU microseconds of plain (unprofiled) training steps, `agg` over steps.

    Thread CPU time excludes the time other processes held the core: on a shared machine it is
    the measure that means something; on an idle one with one thread it equals wall time.
    """
    cuda = trainer.device.type == "cuda"
    walls, cpus = [], []
    for b in batches:
        w0, c0 = time.perf_counter(), time.thread_time()
        trainer.pipeline.progress(iter([b]))
        if cuda:
            torch.cuda.synchronize()
        walls.append((time.perf_counter() - w0) * 1e6)
        cpus.append((time.thread_time() - c0) * 1e6)
    return agg(walls), agg(cpus)
