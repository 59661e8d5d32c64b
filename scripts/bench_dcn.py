"""DCN against dot at equal steps on synthetic data with the planted click model: the test AUC of
each and the step-time cost of the DCN interaction, measured interleaved. Prints one JSON object.

    PYTHONPATH=$PWD python scripts/bench_dcn.py [--steps 600] [--batch 512] [--threads 1]
        [--multi-hot-sizes 3-2-1-...]

Both models train on the same stream (same seed, same batches, same optimizer and learning rate)
and differ only in `--arch-interaction-op`. Their steps run in rounds of `--round` steps, the
order of the two alternating every round, so a busy neighbour slows both alike; a step's time
is its thread-CPU time (time the core was given to another process is not in it) and its wall
time, each the median over the steps after `--warmup`; the spread of the cost is the ratio of
the two models' medians round by round (each round's pair ran back to back). The AUC is on the
synthetic test split after the last step. `--multi-hot-sizes` (as the trainer's flag: one size
per feature, or one for all) makes the planted world's samples bags of that many ids.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _shared import cpu_flags, load_average  # noqa: E402

from dlrm import TrainConfig, Trainer  # noqa: E402
from dlrm.errors import ConfigError  # noqa: E402
from dlrm.settings.sections import parse_bag_sizes  # noqa: E402
from perfmodel.hardware import cpu_model  # noqa: E402

# Kaggle-shaped (the synthetic data's tables are Kaggle's, scaled): the cross layers' width is
# 27 * 16 = 432, and the rank keeps MLPerf DLRM-DCNv2's ratio (512 of 3456, about 0.15)
ARCH = dict(
    arch_sparse_feature_size=16, arch_mlp_bot=(13, 512, 256, 64, 16), arch_mlp_top=(512, 256, 1)
)
DCN = dict(dcn_num_layers=3, dcn_low_rank_dim=64)


def _sizes(text: str) -> tuple[int, ...]:
    """The trainer's own parsing of --multi-hot-sizes, as an argparse type."""
    try:
        return parse_bag_sizes(text, "--multi-hot-sizes")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--multi-hot-sizes: ")) from None


def build(op: str, a: argparse.Namespace, out: Path) -> Trainer:
    cfg = TrainConfig(
        **ARCH, **DCN, arch_interaction_op=op, mini_batch_size=a.batch, learning_rate=a.lr,
        optimizer=a.optimizer, data_size=a.batch * a.steps, test_data_size=a.test_size,
        seed=a.seed, out_dir=str(out / op), progress=False, multi_hot_sizes=a.multi_hot_sizes,
    )  # fmt: skip
    return Trainer(cfg, checkpoints=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--round", type=int, default=10, help="steps of one model before the other's")
    p.add_argument("--warmup", type=int, default=20, help="steps of each left out of the timing")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--test-size", type=int, default=131072)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--multi-hot-sizes", type=_sizes, default=None,
        help="ids per bag, per feature (dash- or comma-separated), passed to the trainer",
    )  # fmt: skip
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-dcn-") as tmp:
        trainers = {op: build(op, a, Path(tmp)) for op in ("dot", "dcn")}
        streams = {op: t.data.train.batches(0) for op, t in trainers.items()}
        cpu: dict[str, list[float]] = {op: [] for op in trainers}
        wall: dict[str, list[float]] = {op: [] for op in trainers}
        losses: dict[str, list[float]] = {op: [] for op in trainers}
        order = ["dot", "dcn"]
        done = 0
        rounds: list[tuple[int, int]] = []  # each round's steps: [start, stop) of both lists
        while done < a.steps:
            n = min(a.round, a.steps - done)
            rounds.append((done, done + n))
            for op in order:
                t = trainers[op]
                for _ in range(n):
                    batch = next(streams[op]).to(t.device)
                    w0, c0 = time.perf_counter(), time.thread_time()
                    out = t.pipeline.progress(iter([batch]))
                    cpu[op].append(time.thread_time() - c0)
                    wall[op].append(time.perf_counter() - w0)
                    losses[op].append(float(out.loss))
            order.reverse()
            done += n
        result = {}
        for op, t in trainers.items():
            metrics = t.evaluate()
            timed_cpu, timed_wall = cpu[op][a.warmup :], wall[op][a.warmup :]
            result[op] = {
                "test_auc": round(float(metrics["auc"]), 5),
                "test_logloss": round(float(metrics["logloss"]), 5),
                "test_ne": round(float(metrics["ne"]), 5),
                "last_100_train_loss": round(statistics.mean(losses[op][-100:]), 5),
                "step_cpu_ms": round(1e3 * statistics.median(timed_cpu), 3),
                "step_wall_ms": round(1e3 * statistics.median(timed_wall), 3),
                "dense_params": sum(p.numel() for p in t.model.dense_parameters()),
            }
    dot, dcn = result["dot"], result["dcn"]
    per_round = [
        statistics.median(cpu["dcn"][i:j]) / statistics.median(cpu["dot"][i:j])
        for i, j in rounds
        if i >= a.warmup
    ]
    q = statistics.quantiles(per_round, n=10) if len(per_round) >= 2 else per_round * 9
    bags = a.multi_hot_sizes
    print(json.dumps({
        "bench": "dcn_vs_dot", "steps": a.steps, "batch": a.batch, "optimizer": a.optimizer,
        "lr": a.lr, "threads": a.threads, "arch": {k: list(v) if isinstance(v, tuple) else v
                                                   for k, v in {**ARCH, **DCN}.items()},
        "data": "synthetic (planted click model, "
        + ("one id per feature)" if bags is None else f"bags of {'-'.join(map(str, bags))} ids)"),
        "multi_hot_sizes": None if bags is None else list(bags),
        **result,
        "dcn_auc_minus_dot": round(dcn["test_auc"] - dot["test_auc"], 5),
        "dcn_step_cpu_ratio": round(dcn["step_cpu_ms"] / dot["step_cpu_ms"], 3),
        "dcn_step_wall_ratio": round(dcn["step_wall_ms"] / dot["step_wall_ms"], 3),
        "dcn_step_cpu_ratio_per_round": {
            "rounds": len(per_round), "median": round(statistics.median(per_round), 3),
            "p10": round(q[0], 3), "p90": round(q[-1], 3),
            "min": round(min(per_round), 3), "max": round(max(per_round), 3),
        },
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "torch": torch.__version__,
        "load_average_before": load_before, "load_average_after": load_average(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
