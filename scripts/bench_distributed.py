"""Multi-process training benchmark: 1 process vs 2 (gloo, on this machine), and what the 2
processes send each other per step, by kind of communication and placement.

    python scripts/bench_distributed.py                  # Kaggle-shaped synthetic, batch 2048
    python scripts/bench_distributed.py --rounds 3 --steps 48 --kinds table_wise,fae:table_wise

A kind is a `--sharding` value (every table sharded that way) or `fae:<sharding>` (`--placement
fae` with several ranks: each table's hot rows replicated on every rank, its cold rows sharded
that way; embeddings/hot_replicated.py). The same model trains the same samples (same seed, same
global batch) in one process (`--placement device`, both cores: what every kind computes) and
in two (`Trainer(cfg, rank, 2)` under a gloo process group, as torchrun runs it, one thread
each), in `--rounds` interleaved rounds; the one process runs with one thread and with two
(on a shared, loaded machine two OpenMP threads can be slower than one); samples/s are medians over rounds of the trainer's own
training time (startup, evaluation and checkpoints excluded), after one untimed warm-up run per
process. On a 2-core machine the two processes share the cores one process had, so the
2-process figure measures overhead, not scaling.

Communication is counted, not timed (perfmodel/collectives.py): every torch.distributed
collective of `--count-steps` steps on rank 0, by kind (ids all-to-all, pooled-embedding
all-to-all forward and backward, all-reduce of the dense part's and of replicated tables'
gradients), payload and wire bytes. Beside it: the communication model's prediction (latency +
wire bytes / bandwidth, fitted from timed all-reduces and all-to-alls on the same process group
in the same run) and the measured time of the gloo collectives (torch.profiler's `gloo:*`
events, which include waiting for the other rank).

Prints one JSON object; `lscpu` flags and load averages are in it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

KINDS = ("table_wise", "column_wise", "data_parallel", "fae:table_wise")


def cpu_flags() -> list[str]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    line = next((x for x in out.splitlines() if x.startswith("Flags:")), "")
    return sorted(f for f in line.split()[1:] if "bf16" in f or "amx" in f or f == "avx512f")


def config(args, out_dir: Path, kind: str, steps: int | None = None):
    from dlrm import TrainConfig

    placement, _, sharding = kind.rpartition(":")
    steps = steps or args.steps
    return TrainConfig(
        mini_batch_size=args.batch, num_batches=steps, data_size=args.batch * steps,
        test_data_size=args.batch * 2, optimizer=args.optimizer, sharding=sharding,
        sharding_min_columns=args.min_columns, synthetic_table_scale=args.table_scale,
        placement=placement or "device", hot_budget=args.hot_budget,
        print_freq=0, out_dir=str(out_dir), progress=False, seed=1,
    )  # fmt: skip


def train_rate(
    args, kind: str, root: Path, rank: int, world: int, steps: int | None = None
) -> dict:
    from dlrm import Trainer

    cfg = config(args, root / f"{kind.replace(':', '-')}-w{world}-{time.time_ns()}", kind, steps)
    summary = Trainer(cfg, rank, world, checkpoints=False).fit()
    return {"samples_per_s": summary["train_samples_per_s"], "auc": summary["test_auc"]}


def _quiet() -> None:
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)


# --- counting the collectives (rank 0 reports) ----------------------------------------------------


def count_step_collectives(args, kind: str, root: Path, rank: int, model) -> dict:
    """Per step: the collectives of `--count-steps` training steps by kind (counted), the
    communication model's time for them, and the gloo collectives' measured time."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.profiler import ProfilerActivity, profile

    from dlrm import Trainer
    from perfmodel.collectives import CollectiveCounter

    # two warm-up steps, then the counted ones: the epoch must hold them all (--steps may be fewer)
    cfg = config(args, root / f"count-{kind.replace(':', '-')}", kind, steps=args.count_steps + 2)
    trainer = Trainer(cfg, rank, 2, checkpoints=False)
    ddp = trainer.pipeline.forward  # the dense part's DDP: a Python hook so its buckets count
    ddp.register_comm_hook(dist.group.WORLD, allreduce_hook)
    batches = trainer.data.train.batches(0)
    for _ in range(2):  # DDP rebuilds its buckets after the first step
        trainer.pipeline.progress(batches)
    steps = args.count_steps
    with CollectiveCounter() as counter, profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer.pipeline.progress(batches)
    gloo_s = sum(e.cpu_time_total for e in prof.events() if e.name.startswith("gloo:")) / 1e6
    emb = trainer.model.embeddings
    per_step = counter.per_step(steps)
    return {
        "per_step": per_step,
        "wire_bytes_per_step": sum(v["wire_bytes"] for v in per_step.values()),
        "predicted_s_per_step": model.predict_s(counter.records) / steps,
        "measured_gloo_s_per_step": gloo_s / steps,
        "placement": emb.placement_info(),
    }


def _worker(rank: int, init: str, args, root: str, result: str, count: bool) -> None:
    _quiet()
    torch.set_num_threads(1)  # two processes on two cores
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        out: dict = {"rates": {}, "comm": {}}
        train_rate(args, args.kinds[0], Path(root), rank, 2, steps=4)  # warm-up, untimed
        for kind in args.kinds:
            out["rates"][kind] = train_rate(args, kind, Path(root), rank, 2)
        if count:
            from perfmodel.collectives import CollectiveModel

            model = CollectiveModel.fit()
            out["communication_model"] = model.as_dict()
            for kind in args.kinds:
                out["comm"][kind] = count_step_collectives(args, kind, Path(root), rank, model)
        if rank == 0:
            Path(result).write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2048, help="global mini-batch")
    p.add_argument("--steps", type=int, default=48, help="training steps per timed run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kinds", default=",".join(KINDS), help="shardings, or fae:<sharding>")
    p.add_argument("--optimizer", default="adagrad")
    p.add_argument("--table-scale", type=float, default=0.01, help="of the Kaggle table sizes")
    p.add_argument("--hot-budget", default="4MB", help="fae kinds: replicated hot rows per rank")
    p.add_argument("--min-columns", type=int, default=8, help="column-wise: narrowest shard")
    p.add_argument("--count-steps", type=int, default=8, help="steps whose collectives are counted")
    args = p.parse_args()
    args.kinds = [k for k in args.kinds.split(",") if k]
    _quiet()
    load = [os.getloadavg()]
    one: dict[int, list[float]] = {1: [], 2: []}
    two: dict[str, list] = {k: [] for k in args.kinds}
    auc: dict[str, dict] = {}
    last: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench_distributed-") as root:
        train_rate(args, "table_wise", Path(root), 0, 1, steps=4)  # warm-up, untimed
        for r in range(args.rounds):
            for threads in (1, 2):  # one process
                torch.set_num_threads(threads)
                got = train_rate(args, "table_wise", Path(root), 0, 1)
                one[threads].append(got["samples_per_s"])
                auc["one_process"] = got["auc"]
            result = Path(root) / f"round{r}.json"
            count = r == args.rounds - 1
            mp.spawn(_worker, args=(f"file://{root}/rdv{r}", args, root, str(result), count),
                     nprocs=2)  # fmt: skip
            last = json.loads(result.read_text())
            for kind in args.kinds:
                two[kind].append(last["rates"][kind]["samples_per_s"])
                auc[kind] = last["rates"][kind]["auc"]
            load.append(os.getloadavg())
    per_kind = {}
    for kind in args.kinds:
        per_kind[kind] = {
            "two_processes_total": stats(two[kind]),
            "two_processes_per_process": stats([x / 2 for x in two[kind]]),
            "two_vs_one_thread": statistics.median(two[kind]) / statistics.median(one[1]),
            "two_vs_two_threads": statistics.median(two[kind]) / statistics.median(one[2]),
        }
    comm = last.get("comm", {})
    for kind in args.kinds:  # a hot-replicated placement against sharding everything the same way
        base = kind.rpartition(":")[2]
        if ":" in kind and base in comm and kind in comm:
            a, b = comm[base]["wire_bytes_per_step"], comm[kind]["wire_bytes_per_step"]
            comm[kind]["wire_bytes_saved_vs_" + base] = a - b
    report = {
        "machine": {
            "cpu_flags": cpu_flags(),
            "cores": os.cpu_count(),
            "load_avg": load,
            "torch": torch.__version__,
        },  # fmt: skip
        "settings": vars(args),
        "samples_per_s": {
            "one_process_one_thread": stats(one[1]),
            "one_process_two_threads": stats(one[2]),
            **per_kind,
        },
        "test_auc": auc,
        "communication_per_step": comm,
        "communication_model": last.get("communication_model"),
        "note": "collectives counted on rank 0; wire bytes: what rank 0 sends to the other rank",
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
