"""Training throughput: ours end to end vs a naive reference-style DLRM step, in one process.

Prints one JSON object. For each batch size (128 and 2048 by default):
- `naive_step_samples_per_s`: the facebookresearch/dlrm-style step on pre-generated batches
  (26 nn.EmbeddingBag(sparse=True), the same MLPs ending in Sigmoid, BCELoss, torch.optim.SGD
  over all parameters), model step only: no data generation counted.
- `fp32_samples_per_s` / `bf16_samples_per_s`: our Trainer's step with its synthetic data
  generator (the body of `Trainer.fit`'s loop: generation, fused embeddings, dense step).
- the speed-ups over the naive step, and `generator_samples_per_s`: the synthetic data alone.
The three are measured in `--rounds` interleaved rounds (naive, fp32, bf16, naive, ...) and
reported as medians; a speed-up is the median of per-round ratios, so slow changes in machine
load (this VM shares its host) cancel. Every round's figure is in `all_rounds_samples_per_s`.
Then `auc`: test AUC of fp32 and bf16 training on the planted synthetic data (same seed, same
batches) and their difference, with `Trainer.fit`'s own `train_samples_per_s` as a cross-check.

    python scripts/bench_train.py                      # full Kaggle table sizes (about 2.2 GB)
    python scripts/bench_train.py --table-scale 0.01   # quick
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time

import torch
from torch import nn

from data_pipeline.synthetic import (
    KAGGLE_TABLE_SIZES,
    PlantedWorld,
    SyntheticBatchSource,
    SyntheticConfig,
)
from dlrm import TrainConfig, Trainer

BOTTOM = (13, 512, 256, 64, 16)
TOP = (512, 256, 1)
DIM = 16


class NaiveDLRM(nn.Module):
    """The reference's structure: one EmbeddingBag per table, MLPs with a final Sigmoid."""

    def __init__(self, table_sizes: list[int]) -> None:
        super().__init__()
        self.embs = nn.ModuleList(
            nn.EmbeddingBag(n, DIM, mode="sum", sparse=True) for n in table_sizes
        )
        self.bot = _mlp(BOTTOM, sigmoid=False)
        n = len(table_sizes) + 1
        self.top = _mlp((n * (n - 1) // 2 + DIM, *TOP), sigmoid=True)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.li, self.lj = li, lj

    def forward(self, dense, kjt):
        x = self.bot(dense)
        feats = kjt.to_dict()
        ly = [
            emb(feats[k].values(), feats[k].offsets()[:-1]) for k, emb in zip(kjt.keys(), self.embs)
        ]
        t = torch.cat([x] + ly, dim=1).view(x.shape[0], -1, DIM)
        z = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([x, z[:, self.li, self.lj]], dim=1)).squeeze(1)


def _mlp(widths, sigmoid: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        last = i == len(widths) - 2
        layers.append(nn.Sigmoid() if (last and sigmoid) else nn.ReLU())
    return nn.Sequential(*layers)


class NaiveStep:
    """The reference-style model and optimizer, stepping through pre-generated batches."""

    def __init__(self, table_sizes: list[int], batch_size: int, steps: int) -> None:
        world = PlantedWorld(SyntheticConfig(table_sizes=table_sizes, seed=0))
        # pre-generated: the naive figure is the model step alone
        self.batches = list(SyntheticBatchSource(world, "train", batch_size, steps).batches())
        self.model = NaiveDLRM(table_sizes)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loss_fn = nn.BCELoss()
        self.i = 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            b = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.opt.zero_grad()
            loss = self.loss_fn(self.model(b.dense_features, b.sparse_features), b.labels)
            loss.backward()
            self.opt.step()


class OursStep:
    """Our trainer's step with its data generator: the train pipeline `Trainer.fit` runs."""

    def __init__(self, table_sizes, batch_size: int, precision: str, out_dir: str) -> None:
        cfg = make_config(table_sizes, batch_size, 1_000_000, precision, out_dir)
        self.trainer = Trainer(cfg)
        self.batches = self.trainer.data.train.batches(0)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.trainer.pipeline.progress(self.batches)


def timed(step, steps: int, batch_size: int) -> float:
    start = time.perf_counter()
    step.run(steps)
    return steps * batch_size / (time.perf_counter() - start)


def generator_throughput(
    table_sizes: list[int], batch_size: int, samples: int = 1_000_000
) -> float:
    """Synthetic batches per second from the planted world alone (what a training step waits on)."""
    world = PlantedWorld(SyntheticConfig(table_sizes=table_sizes, seed=0))
    source = SyntheticBatchSource(world, "train", batch_size, samples // batch_size + 1)
    batches = source.batches()
    next(batches)  # compile / load the numba kernel
    start = time.perf_counter()
    for _ in range(samples // batch_size):
        next(batches)
    return (samples // batch_size) * batch_size / (time.perf_counter() - start)


def make_config(
    table_sizes, batch_size, steps, precision, out_dir, test_size=16384, seed=0
) -> TrainConfig:
    return TrainConfig(
        arch_embedding_size=tuple(table_sizes), arch_sparse_feature_size=DIM,
        arch_mlp_bot=BOTTOM, arch_mlp_top=TOP, mini_batch_size=batch_size,
        data_size=steps * batch_size, test_data_size=test_size, learning_rate=0.1,
        precision=precision, seed=seed, out_dir=out_dir, progress=False, print_freq=0,
    )  # fmt: skip


def compare(sizes, bs: int, seconds: float, rounds: int, tmp: str) -> dict:
    """Alternate naive / fp32 / bf16 in `rounds` rounds; medians of throughput and of the
    per-round speed-up (adjacent measurements, so slow drifts in machine load cancel)."""
    per_step = 30_000 if bs <= 256 else 60_000  # rough samples/s, sets steps per round
    steps = max(5, int(seconds * per_step / bs / rounds))
    naive = NaiveStep(sizes, bs, steps * rounds)
    ours = {p: OursStep(sizes, bs, p, f"{tmp}/{bs}-{p}") for p in ("fp32", "bf16")}
    for step in (naive, *ours.values()):  # warm-up: first-touch of tables, kernel caches
        step.run(3)
    runs: dict[str, list[float]] = {"naive": [], "fp32": [], "bf16": []}
    for _ in range(rounds):
        runs["naive"].append(timed(naive, steps, bs))
        for p, step in ours.items():
            runs[p].append(timed(step, steps, bs))
    med = statistics.median
    row = {"steps_per_round": steps, "rounds": rounds,
           "generator_samples_per_s": generator_throughput(sizes, bs),
           "naive_step_samples_per_s": med(runs["naive"])}  # fmt: skip
    for p in ("fp32", "bf16"):
        row[f"{p}_samples_per_s"] = med(runs[p])
        row[f"{p}_speedup_vs_naive"] = med([o / n for o, n in zip(runs[p], runs["naive"])])
    row["all_rounds_samples_per_s"] = runs
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table-scale", type=float, default=1.0, help="scale of the Kaggle table sizes")
    p.add_argument("--batch-sizes", default="128,2048")
    p.add_argument("--seconds", type=float, default=8.0, help="target duration of each measurement")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per batch size")
    p.add_argument(
        "--auc-steps", type=int, default=400, help="steps of batch 2048 for the AUC check"
    )
    p.add_argument("--skip-auc", action="store_true")
    args = p.parse_args()
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    sizes = [max(2, int(n * args.table_scale)) for n in KAGGLE_TABLE_SIZES]
    result: dict = {
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "processor": platform.processor(), "load_avg": os.getloadavg()},
        "table_rows": sum(sizes), "embedding_dim": DIM, "batches": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for bs in [int(x) for x in args.batch_sizes.split(",")]:
            row = compare(sizes, bs, args.seconds, args.rounds, tmp)
            result["batches"][str(bs)] = row
            print(json.dumps({bs: row}), flush=True)
        if not args.skip_auc:
            summaries = {
                p: Trainer(
                    make_config(sizes, 2048, args.auc_steps, p, f"{tmp}/auc-{p}", test_size=262_144)
                ).fit()
                for p in ("fp32", "bf16")
            }
            aucs = {p: s["test_auc"] for p, s in summaries.items()}
            result["auc"] = {
                **aucs,
                "steps": args.auc_steps,
                "batch": 2048,
                "bf16_minus_fp32": aucs["bf16"] - aucs["fp32"],
                # Trainer.fit's own figure (one run each, not interleaved): a cross-check
                "fit_train_samples_per_s": {
                    p: s["train_samples_per_s"] for p, s in summaries.items()
                },
            }
    result["machine"]["load_avg_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
