"""TBSM vs a DLRM on the candidate alone, on planted synthetic UserBehavior data; prints JSON.

    python scripts/bench_tbsm_vs_dlrm.py [--users 3000] [--ts-length 20] [--epochs 1] ...

Writes a synthetic UserBehavior.csv whose next category follows the user's recent ones
(data_pipeline/taobao_synthetic.py), preprocesses it, and trains with the same data, seed and
budget (batches, epochs, optimizer, training seeds) the baseline DLRM on the candidate step (top 15-1), TBSM
with the reference configuration (tsl def/mlp, dim 16, bottom 1-16, top 15-15, tsl-mlp 15-15,
arch-mlp 60-1, Adagrad 0.05) and its variants (tsl dot/mul, mha, rnn). Reported per model: test
AUC per training seed (TBSM's TSL is seed-sensitive: Adagrad sometimes stays stuck near the
start, which the reference works around by picking the best of 5 seeds), mean and minimum,
the gap to the baseline (mean, and per seed), steps and training time; and the oracle AUC of the planted rule
(score = how many of the last `recent` history categories equal the candidate's), the ceiling
any model can reach on this data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _shared import check_bench_out  # scripts/ is on the path of a script run by name

from data_pipeline.taobao import TaobaoOptions, preprocess_taobao
from data_pipeline.taobao_synthetic import PlantedBehavior, write_user_behavior
from dlrm.config import TrainConfig
from dlrm.metrics import binary_metrics
from dlrm.trainer import Trainer
from hybrid_dlrm.common import quick

VARIANTS = {
    "dlrm_candidate": dict(model="dlrm", arch_mlp_top=(15, 1)),
    "tbsm_tsl_def_mlp": dict(model="tbsm", model_type="tsl", tsl_inner="def", tsl_mechanism="mlp"),
    "tbsm_tsl_dot_mul": dict(model="tbsm", model_type="tsl", tsl_inner="dot", tsl_mechanism="mul"),
    "tbsm_mha": dict(model="tbsm", model_type="mha"),
    "tbsm_rnn": dict(model="tbsm", model_type="rnn"),
}


def oracle_auc(directory: Path, recent: int) -> float:
    cats = np.load(directory / "test.categories.npy")
    labels = np.load(directory / "test.labels.npy")
    score = (cats[:, -1 - recent : -1] == cats[:, -1:]).sum(1)
    return binary_metrics(
        torch.tensor(score, dtype=torch.float32), torch.tensor(labels, dtype=torch.float32)
    )["auc"]


def walk_sizes(a: argparse.Namespace, prog: str) -> None:
    """HYBRID_DLRM_QUICK (hybrid_dlrm/common/quick.py): the docs' walk runs this at its sizes."""
    if quick.active():
        a.users = quick.cap("--users", a.users)
        a.epochs = quick.cap("--epochs", a.epochs, like="--nepochs")
        seeds = a.seeds.split(",")
        a.seeds = ",".join(seeds[: quick.cap("--seeds", len(seeds))])
        quick.announce(prog)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/bench_tbsm_vs_dlrm"))
    p.add_argument("--users", type=int, default=3000)
    p.add_argument("--min-events", type=int, default=30)
    p.add_argument("--max-events", type=int, default=60)
    p.add_argument("--categories", type=int, default=8)
    p.add_argument("--items-per-category", type=int, default=50)
    p.add_argument("--recent", type=int, default=1)
    p.add_argument("--follow", type=float, default=0.8)
    p.add_argument("--ts-length", type=int, default=20)
    p.add_argument("--points-per-user", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--learning-rate", type=float, default=0.05)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--mha-num-heads", type=int, default=2)
    p.add_argument("--data-seed", type=int, default=123, help="seed of the synthetic data")
    p.add_argument("--seeds", default="1,2,3", help="training seeds; every model runs with each")
    p.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (small ops: 1 is fastest)"
    )
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated subset of " + ",".join(VARIANTS),
    )
    a = p.parse_args(argv)
    walk_sizes(a, p.prog)
    torch.set_num_threads(a.threads)
    spec = PlantedBehavior(num_users=a.users, min_events=a.min_events, max_events=a.max_events,
                           num_categories=a.categories, items_per_category=a.items_per_category,
                           recent=a.recent, follow=a.follow, seed=a.data_seed)  # fmt: skip
    check_bench_out(a.out, [], False, p.prog)  # the output rule, before any work
    a.out.mkdir(parents=True, exist_ok=True)
    raw = a.out / f"UserBehavior_u{a.users}_s{a.data_seed}.csv"
    if not raw.exists():
        write_user_behavior(raw, spec)
    data = preprocess_taobao(raw, a.out / f"{raw.stem}.t{a.ts_length}",
                             TaobaoOptions(ts_length=a.ts_length, points_per_user=a.points_per_user))  # fmt: skip
    meta = json.loads((data / "meta.json").read_text())
    results = {}
    seeds = [int(x) for x in a.seeds.split(",")]
    for name in a.variants.split(","):
        if name not in VARIANTS:
            print(f"--variants: unknown {name!r}", file=sys.stderr)
            return 2
        settings = {"arch_mlp_top": (15, 15), **VARIANTS[name]}
        runs = []
        for seed in seeds:
            cfg = TrainConfig(
                data_set="taobao", processed_data_file=str(data), ts_length=a.ts_length,
                arch_sparse_feature_size=16, arch_mlp_bot=(1, 16), tsl_mlp=(15, 15),
                arch_mlp=(60, 1), mha_num_heads=a.mha_num_heads, mini_batch_size=a.batch_size,
                test_mini_batch_size=4096, optimizer="adagrad", learning_rate=a.learning_rate,
                nepochs=a.epochs, seed=seed, print_freq=0, progress=False,
                out_dir=str(a.out / f"{name}_seed{seed}"), **settings,
            )  # fmt: skip
            t0 = time.perf_counter()
            s = Trainer(cfg).fit()
            runs.append((s["test_auc"], s["steps"], s["wall_s"], time.perf_counter() - t0))
        aucs = [r[0] for r in runs]
        results[name] = {"test_auc_per_seed": [round(x, 4) for x in aucs], "mean_test_auc": round(float(np.mean(aucs)), 4),
                         "min_test_auc": round(min(aucs), 4), "steps": runs[0][1],
                         "train_s_per_run": round(float(np.mean([r[2] for r in runs])), 1)}  # fmt: skip
        print(f"{name}: {results[name]}", file=sys.stderr)
    base = results.get("dlrm_candidate")
    if base is not None:
        for r in results.values():
            r["mean_gap_to_dlrm"] = round(r["mean_test_auc"] - base["mean_test_auc"], 4)
            r["gap_to_dlrm_per_seed"] = [
                round(x - y, 4) for x, y in zip(r["test_auc_per_seed"], base["test_auc_per_seed"])
            ]
    print(json.dumps({
        "data": {"users": a.users, "rows": {k: v["rows"] for k, v in meta["splits"].items()},
                 "table_sizes": meta["table_sizes"], "ts_length": a.ts_length,
                 "planted": {"categories": a.categories, "recent": a.recent, "follow": a.follow},
                 "oracle_test_auc": round(oracle_auc(data, a.recent), 4)},
        "budget": {"batch_size": a.batch_size, "epochs": a.epochs, "optimizer": "adagrad",
                   "learning_rate": a.learning_rate, "seeds": seeds, "threads": a.threads},
        "results": results,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
