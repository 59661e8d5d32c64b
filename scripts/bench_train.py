"""Training throughput: ours end to end vs a naive reference-style DLRM step and vs the dense-only
bound, in one process.

Prints one JSON object. For each batch size (128 and 2048 by default), samples/s of:
- `naive`: the facebookresearch/dlrm-style step on pre-generated batches (26
  nn.EmbeddingBag(sparse=True), the same MLPs ending in Sigmoid, BCELoss, torch.optim.SGD over all
  parameters), model step only: no data generation counted;
- `fp32`, `bf16`: our Trainer's step with its synthetic data generator (the body of `Trainer.fit`'s
  loop: generation, fused embeddings, dense step) with the default `--compile` (auto: bf16
  compiled, fp32 eager); `bf16_eager`: bf16 with `--compile=false`; `fp32_fbgemm_module`,
  `bf16_fbgemm_module`: the same with fbgemm's own embedding module (its serial SGD update, the
  step before embeddings/cpu_tbe.py);
- `dense_only_fp32`, `dense_only_bf16`: our model's dense part alone (MLPs, interaction, loss,
  dense optimizer; no embeddings, no data): the bound our step can reach;
and the ratios `X_vs_naive`, `X_vs_dense_only_*`, plus `generator_samples_per_s` (the synthetic
data alone). The variants alternate in `--rounds` rounds and are reported as medians; a ratio is
the median of per-round ratios, so slow changes in machine load (this VM shares its host) cancel.
Every round's figure is in `all_rounds_samples_per_s`. `targets`: the issue's targets, each met,
missed or not measurable (bf16 on a CPU without bf16 units). `machine.cpu_flags`: the CPU's
bf16/AMX flags. Then `auc`: test AUC of fp32 and bf16 training on the planted synthetic data (same
seed, same batches) and their difference, with `Trainer.fit`'s own figure as a cross-check.

    python scripts/bench_train.py                      # full Kaggle table sizes (about 2.2 GB each)
    python scripts/bench_train.py --table-scale 0.01   # quick
    python scripts/bench_train.py --variants naive,bf16,dense_only_bf16 --batch-sizes 2048
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
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
from dlrm.pipelines.base import loss_of
from embeddings import cpu_tbe
from hybrid_dlrm.common import quick
from perfmodel import hardware
from perfmodel.sweeps import linear_gemms

BOTTOM = (13, 512, 256, 64, 16)
TOP = (512, 256, 1)
DIM = 16
DATA_STEPS = 1_000_000  # steps of data each variant's trainer is given: as long as any run


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

    def __init__(self, table_sizes, batch_size: int, precision: str, out_dir: str,
                 compile: bool | None, data_steps: int) -> None:  # fmt: skip
        cfg = make_config(table_sizes, batch_size, data_steps, precision, out_dir, compile=compile)
        self.trainer = Trainer(cfg)
        self.batches = self.trainer.data.train.batches(0)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.trainer.pipeline.progress(self.batches)


class DenseOnlyStep:
    """The bound our step can reach: our model's dense part alone (MLPs and interaction, the
    same precision and compilation as our step, the gradient to the pooled embeddings computed)
    with the loss and the dense optimizer, on one fixed input: no embeddings, no data."""

    def __init__(self, batch_size: int, precision: str, out_dir: str,
                 compile: bool | None = None, data_steps: int = DATA_STEPS) -> None:  # fmt: skip
        # tables of 2 rows: the dense part does not depend on them; as many steps as OursStep's,
        # so that `--compile=auto` decides alike
        cfg = make_config([2] * len(KAGGLE_TABLE_SIZES), batch_size, data_steps, precision,
                          out_dir, compile=compile)  # fmt: skip
        trainer = Trainer(cfg, checkpoints=False)
        self.model, self.optimizer = trainer.model, trainer.dense_optimizer
        # --compile's written-out step, or None (also in a checkout from before it existed)
        written = getattr(trainer.pipeline, "written", None)
        self.written = (
            written.train_step if written is not None and written.writes_steps() else None
        )
        self.bf16 = precision == "bf16"
        g = torch.Generator().manual_seed(0)
        width = len(KAGGLE_TABLE_SIZES) * DIM
        self.dense = torch.rand(batch_size, BOTTOM[0], generator=g)
        self.pooled = torch.randn(batch_size, width, generator=g).mul_(0.1).requires_grad_()
        self.labels = torch.randint(0, 2, (batch_size,), generator=g).float()

    def run(self, steps: int) -> None:
        if self.written is not None:
            return self._run_written(steps)
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model.dense_forward(self.dense, self.pooled)
            loss = loss_of(logits, self.labels, "bce")
            loss.item()  # as the real step, which checks the loss is finite
            self.optimizer.zero_grad(set_to_none=True)
            self.pooled.grad = None
            loss.backward()
            self.optimizer.step()

    def _run_written(self, steps: int) -> None:
        """As the trainer's step runs the written-out dense step (dlrm/pipelines/dense_step.py)."""
        for _ in range(steps):
            out = self.written(self.dense, self.pooled.detach(), self.labels, self.optimizer)
            loss, self.pooled.grad, grads = out
            loss.item()
            for p, g in grads:
                p.grad = g
            if grads:  # else plain SGD, applied by the written-out step
                self.optimizer.step()


class GemmOnlyStep:
    """The matrix products of our dense step and nothing else: per MLP layer its forward, input
    gradient (not for the first layer, whose input needs none) and weight gradient, and the
    interaction's two bmm, in the layouts training runs them (perfmodel.sweeps.linear_gemms).
    No step that runs these products with these kernels can be faster: naive / gemm_only is the
    ceiling of any speed-up over the naive step."""

    def __init__(self, batch_size: int, precision: str) -> None:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        n = len(KAGGLE_TABLE_SIZES) + 1
        top_in = n * (n - 1) // 2 + DIM
        self.calls = []
        for layers, first in ((BOTTOM, True), ((top_in, *TOP), False)):
            for i, (fi, fo) in enumerate(zip(layers[:-1], layers[1:])):
                gemms = linear_gemms(batch_size, fi, fo, dtype)
                self.calls += [
                    fn for j, (_, _, fn) in enumerate(gemms) if not (first and i == 0 and j == 1)
                ]
        t = torch.randn(batch_size, n, DIM).to(dtype)
        t_t = t.transpose(1, 2).contiguous()
        g = torch.randn(batch_size, n, n).to(dtype)
        self.calls += [lambda: torch.bmm(t_t.transpose(1, 2), t_t), lambda: torch.bmm(g, t)]

    def run(self, steps: int) -> None:
        for _ in range(steps):
            for call in self.calls:
                call()


def weight_casts(batch_size: int, tmp: str, steps: int = 10) -> dict:
    """What autocast's casts cost in an eager bf16 dense step (torch.profiler): the casts of
    parameter-shaped tensors (weights and biases to bf16, their gradients back) against the
    activations' casts, per step, next to the profiled step's total."""
    step = DenseOnlyStep(batch_size, "bf16", f"{tmp}/casts", compile=False)
    step.run(3)
    shapes = {tuple(p.shape) for p in step.model.dense_parameters()}
    with torch.profiler.profile(record_shapes=True) as prof:
        step.run(steps)
    weight = other = 0.0
    for e in prof.events():
        if e.name == "aten::_to_copy":
            is_param = bool(e.input_shapes) and tuple(e.input_shapes[0]) in shapes
            if is_param:
                weight += e.cpu_time_total
            else:
                other += e.cpu_time_total
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    return {"batch": batch_size, "step_ms": total / steps / 1e3,
            "parameter_casts_ms": weight / steps / 1e3, "activation_casts_ms": other / steps / 1e3}  # fmt: skip


def timed(step, steps: int, batch_size: int) -> tuple[float, float]:
    """Samples/s (wall) and this thread's CPU milliseconds per step: with one torch thread and
    NUMBA_NUM_THREADS=1 the whole step runs on this thread, and its CPU time is what the step
    costs whatever else the machine runs."""
    start, cpu = time.perf_counter(), time.thread_time()
    step.run(steps)
    cpu_ms = (time.thread_time() - cpu) * 1e3 / steps
    return steps * batch_size / (time.perf_counter() - start), cpu_ms


def generator_throughput(table_sizes: list[int], batch_size: int, samples: int) -> float:
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
    table_sizes, batch_size, steps, precision, out_dir, test_size=16384, seed=0, compile=None
) -> TrainConfig:
    return TrainConfig(
        arch_embedding_size=tuple(table_sizes), arch_sparse_feature_size=DIM,
        arch_mlp_bot=BOTTOM, arch_mlp_top=TOP, mini_batch_size=batch_size,
        data_size=steps * batch_size, test_data_size=test_size, learning_rate=0.1,
        precision=precision, seed=seed, out_dir=out_dir, progress=False, print_freq=0,
        compile=compile,
    )  # fmt: skip


# name -> (precision, --compile); `ours_*` is the whole step, `dense_only_*` its dense part
VARIANTS = {
    "fp32": ("fp32", None), "bf16": ("bf16", None), "bf16_eager": ("bf16", False),
    "fp32_compiled": ("fp32", True), "dense_only_fp32": ("fp32", None),
    "dense_only_bf16": ("bf16", None), "dense_only_fp32_compiled": ("fp32", True),
    "gemm_only_fp32": ("fp32", None), "gemm_only_bf16": ("bf16", None),
    # our step with fbgemm's own embedding module (its serial SGD update): before cpu_tbe.py
    "fp32_fbgemm_module": ("fp32", None), "bf16_fbgemm_module": ("bf16", None),
}  # fmt: skip

# (what, of, over, at least, batch size, needs bf16 units): the targets
TARGETS = (
    ("bf16", "naive", 3.0, 2048, True), ("bf16", "naive", 2.0, 128, True),
    ("fp32", "dense_only_fp32", 0.9, 2048, False), ("fp32", "naive", 1.6, 128, False),
)  # fmt: skip


def make_step(name: str, sizes, bs: int, rounds_steps: int, tmp: str, data_steps: int):
    if name == "naive":
        return NaiveStep(sizes, bs, rounds_steps)
    precision, compile = VARIANTS[name]
    if name.startswith("gemm_only"):
        return GemmOnlyStep(bs, precision)
    if name.startswith("dense_only"):
        return DenseOnlyStep(bs, precision, f"{tmp}/{bs}-{name}", compile, data_steps)
    if name.endswith("_fbgemm_module"):
        applies, cpu_tbe.applies = cpu_tbe.applies, lambda *a: False
        try:
            return OursStep(sizes, bs, precision, f"{tmp}/{bs}-{name}", compile, data_steps)
        finally:
            cpu_tbe.applies = applies
    return OursStep(sizes, bs, precision, f"{tmp}/{bs}-{name}", compile, data_steps)


BASES = ("naive", "dense_only_fp32", "dense_only_bf16")


def compare(sizes, bs: int, args: argparse.Namespace, names: list[str], tmp: str) -> dict:
    """Alternate the variants in `rounds` rounds; medians of throughput and of the per-round
    ratios to the naive step and to the dense-only bound (adjacent measurements, so slow drifts
    in machine load cancel)."""
    seconds, rounds = args.seconds, args.rounds
    per_step = 30_000 if bs <= 256 else 60_000  # rough samples/s, sets steps per round
    steps = max(5, int(seconds * per_step / bs / rounds))
    runs: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    stepper = {}
    for name in names:
        stepper[name] = make_step(name, sizes, bs, steps * rounds, tmp, args.data_steps)
        stepper[name].run(3)  # warm-up: first touch of tables, kernel caches, compilation
        runs[name], cpu[name] = [], []
    for _ in range(rounds):
        for name in names:
            rate, cpu_ms = timed(stepper[name], steps, bs)
            runs[name].append(rate)
            cpu[name].append(cpu_ms)
    med = statistics.median
    row: dict = {"steps_per_round": steps, "rounds": rounds,
                 "generator_samples_per_s": generator_throughput(sizes, bs, args.generator_samples)}  # fmt: skip
    for name in names:
        row[f"{name}_samples_per_s"] = med(runs[name])
        row[f"{name}_cpu_ms_per_step"] = med(cpu[name])
    for name in names:
        bases = ["naive"] if name.startswith(("dense_only", "gemm_only")) else BASES
        for base in bases:
            if base in runs and name != base:
                row[f"{name}_vs_{base}"] = med([a / b for a, b in zip(runs[name], runs[base])])
                # in CPU time: the speed-up is the base's CPU per step over this one's
                row[f"{name}_cpu_vs_{base}"] = med([b / a for a, b in zip(cpu[name], cpu[base])])
    row["all_rounds_samples_per_s"] = runs
    row["all_rounds_cpu_ms_per_step"] = cpu
    return row


def judge(result: dict, bf16_units: bool) -> list[dict]:
    """The issue's targets, each met, missed or not measurable here."""
    out = []
    for what, over, least, bs, needs_bf16 in TARGETS:
        row = result["batches"].get(str(bs), {})
        value = row.get(f"{what}_vs_{over}")
        status = "not measured" if value is None else ("met" if value >= least else "missed")
        cpu_value = row.get(f"{what}_cpu_vs_{over}")
        if needs_bf16 and not bf16_units:
            status = "not measurable: no bf16 units on this CPU"
        # the most any step running our dense part's matrix products could reach
        ceiling = row.get(f"gemm_only_{what}_vs_naive") if over == "naive" else 1.0
        out.append({"target": f"{what} >= {least}x {over} at batch {bs}", "value": value,
                    "cpu_time_value": cpu_value, "ceiling": ceiling, "status": status})  # fmt: skip
    return out


def walk_sizes(args: argparse.Namespace, prog: str) -> None:
    """HYBRID_DLRM_QUICK (hybrid_dlrm/common/quick.py): the docs' walk runs this at its sizes."""
    args.data_steps, args.generator_samples = DATA_STEPS, 1_000_000
    args.auc_batch, args.auc_test_size = 2048, 262_144
    if quick.active():
        args.table_scale = quick.cap_scale(
            "--table-scale", args.table_scale, like="--synthetic-table-scale"
        )
        args.seconds = quick.cap_scale("--seconds", args.seconds)
        args.rounds = quick.cap("--rounds", args.rounds)
        args.batch_sizes = ",".join(
            str(quick.cap("--batch-sizes", int(b), like="--mini-batch-size"))
            for b in args.batch_sizes.split(",")
        )
        if not args.skip_auc:
            args.auc_steps = quick.cap("--auc-steps", args.auc_steps, like="--num-batches")
            args.auc_batch = quick.cap("the AUC check's batch", 2048, like="--mini-batch-size")
            args.auc_test_size = quick.cap(
                "its test samples", args.auc_test_size, like="--test-data-size"
            )
        args.data_steps = quick.cap("steps of data per variant", args.data_steps)
        args.generator_samples = quick.cap("generator samples", args.generator_samples)
        quick.announce(prog)


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
    p.add_argument("--weight-casts", action="store_true",
                   help="also profile what autocast's casts cost in an eager bf16 dense step")  # fmt: skip
    p.add_argument("--variants", default="naive,fp32,bf16,bf16_eager,dense_only_fp32,dense_only_bf16,gemm_only_fp32,gemm_only_bf16",
                   help="comma-separated, measured in this order in every round")  # fmt: skip
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (0: torch's default); 1 with NUMBA_NUM_THREADS=1 makes the "
                        "CPU-time figures the whole step's")  # fmt: skip
    args = p.parse_args()
    walk_sizes(args, p.prog)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [x for x in args.variants.split(",") if x]
    unknown = sorted(set(names) - {"naive", *VARIANTS})
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}")
    sizes = [max(2, int(n * args.table_scale)) for n in KAGGLE_TABLE_SIZES]
    bf16_units = hardware.has_bf16_units()
    result: dict = {
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "cpu": hardware.cpu_model(), "cpu_flags": hardware.cpu_flags(),
                    "bf16_units": bf16_units, "load_avg": os.getloadavg(),
                    "numba_threads": os.environ.get("NUMBA_NUM_THREADS")},
        "table_rows": sum(sizes), "embedding_dim": DIM, "batches": {},
    }  # fmt: skip
    if not bf16_units:
        print("this CPU has no bf16 units (avx512_bf16/amx_bf16): bf16 is emulated, and the bf16 "
              "targets are not measurable here", file=sys.stderr)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for bs in [int(x) for x in args.batch_sizes.split(",")]:
            row = compare(sizes, bs, args, names, tmp)
            result["batches"][str(bs)] = row
            print(json.dumps({bs: row}), flush=True)
        if not args.skip_auc:
            summaries = {
                p: Trainer(
                    make_config(
                        sizes,
                        args.auc_batch,
                        args.auc_steps,
                        p,
                        f"{tmp}/auc-{p}",
                        test_size=args.auc_test_size,
                    )
                ).fit()
                for p in ("fp32", "bf16")
            }
            aucs = {p: s["test_auc"] for p, s in summaries.items()}
            result["auc"] = {
                **aucs,
                "steps": args.auc_steps,
                "batch": args.auc_batch,
                "bf16_minus_fp32": aucs["bf16"] - aucs["fp32"],
                # Trainer.fit's own figure (one run each, not interleaved): a cross-check
                "fit_train_samples_per_s": {
                    p: s["train_samples_per_s"] for p, s in summaries.items()
                },
            }
        if args.weight_casts:
            result["weight_casts"] = weight_casts(2048, tmp)
    result["targets"] = judge(result, bf16_units)
    result["machine"]["load_avg_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
