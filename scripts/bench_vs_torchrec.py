"""Side by side with torchrec's own DLRM and DLRM_DCN trained the torchrec way, in one process.

The peer is torchrec's `DLRMTrain(DLRM(...))` / `DLRMTrain(DLRM_DCN(...))` as its DLRM example
trains it: `apply_optimizer_in_backward` puts the sparse optimizer into the embedding backward,
`DistributedModelParallel` (a gloo process group of world size 1, on CPU) shards the tables into
fbgemm's fused table-batched embedding, and a `KeyedOptimizerWrapper` steps the remaining (dense)
parameters. Its batches (KeyedJaggedTensor) are drawn from our synthetic generator before timing
and reused in turn; ours is our trainer's step with its own generator (`bench_train.OursStep`:
generation counted), so the comparison favours the peer where it differs.

Two cases, the same shapes, batch, optimizer and precision on both sides:
- `dlrm_dot`: DLRM with the dot interaction, Kaggle table sizes (`--table-scale` shrinks them),
  dim 16, bottom 13-512-256-64-16, top 512-256-1, SGD lr 0.1 (sparse and dense);
- `dlrm_dcn`: MLPerf DLRM-DCNv2 shapes (dlrm/recipes/terabyte-dcn.toml): dim 128, 26 tables capped
  at `--dcn-rows` rows, MLPerf's multi-hot bags (214 ids a sample), bottom 13-512-256-128, 3
  low-rank cross layers of rank 512, top 1024-1024-512-256-1, Adagrad lr 0.1 eps 1e-8 (sparse:
  fbgemm's exact Adagrad on both sides; dense: torch.optim.Adagrad).

Variants, run in this order in every one of `--rounds` interleaved rounds of about `--seconds`
each: `torchrec_fp32`, `torchrec_bf16` (eager autocast of the forward; one model for both),
`ours_fp32_eager`, `ours_bf16_eager` (`--compile=false`), `ours_fp32`, `ours_bf16` (our defaults,
`--compile` auto: a bf16 run of this length compiles, a cold compile takes minutes). Before
timing, ours' initial weights are copied into the peer (`copy_weights`), so both train the
same model. Per case and batch size: median samples/s and spread ((max - min) / median) of every
variant, the thread CPU milliseconds per step, and the ratios ours / torchrec at equal precision
as the median of per-round ratios (adjacent measurements: slow drifts in machine load cancel).
Also: CPU model and flags, torch threads, load average before and after, the CPUs other
processes kept busy during each case, and the torch, fbgemm_gpu and torchrec versions.

    python scripts/bench_vs_torchrec.py --seconds 8 --rounds 7       # full Kaggle tables, 100k-row DCN
    python scripts/bench_vs_torchrec.py --table-scale 0.001 --dcn-rows 1000 --seconds 0.2 --rounds 1
    python scripts/bench_vs_torchrec.py --cases dlrm_dot --batch-sizes 2048 --variants torchrec_bf16,ours_bf16_eager

`tests/scripts/test_bench_vs_torchrec.py` checks that the two compute the same thing: with the
weights copied across, one step on one batch in fp32 gives the same loss and the same updated
rows and weights.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _shared import cpu_flags, load_average  # noqa: E402
from bench_train import OursStep, timed  # noqa: E402
from torch import nn  # noqa: E402

from data_pipeline.synthetic import KAGGLE_TABLE_SIZES  # noqa: E402
from dlrm import TrainConfig, Trainer  # noqa: E402
from dlrm.config import MLPERF_DCNV2_MULTI_HOT, MLPERF_DCNV2_TABLES  # noqa: E402
from dlrm.processes.thread_watch import CpuSampler  # noqa: E402
from hybrid_dlrm.common import quick  # noqa: E402
from perfmodel.hardware import cpu_model  # noqa: E402

PROG = "bench_vs_torchrec.py"


@dataclass(frozen=True)
class Case:
    """One model, built alike on both sides."""

    name: str
    dim: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]
    interaction: str  # "dot" or "dcn"
    optimizer: str  # ours' name: "sgd" or "adagrad" (fbgemm's exact Adagrad)
    lr: float = 0.1
    multi_hot: tuple[int, ...] | None = None
    dcn_layers: int = 3
    dcn_rank: int = 512


DOT = Case("dlrm_dot", 16, (13, 512, 256, 64, 16), (512, 256, 1), "dot", "sgd")
DCN = Case("dlrm_dcn", 128, (13, 512, 256, 128), (1024, 1024, 512, 256, 1), "dcn", "adagrad",
           multi_hot=MLPERF_DCNV2_MULTI_HOT)  # fmt: skip
CASES = {c.name: c for c in (DOT, DCN)}
ADAGRAD_EPS = 1e-8  # ours (embeddings/optimizer.py) and the MLPerf reference's


def table_sizes(case: Case, table_scale: float, dcn_rows: int) -> list[int]:
    if case.interaction == "dot":
        return [max(2, int(n * table_scale)) for n in KAGGLE_TABLE_SIZES]
    return [min(n, dcn_rows) for n in MLPERF_DCNV2_TABLES]


def train_config(case: Case, sizes, batch: int, precision: str, out_dir: str,
                 compile: bool | None = None, steps: int = 1_000_000, seed: int = 0) -> TrainConfig:  # fmt: skip
    """Our run of `case` (as many steps as bench_train's, so `--compile` auto decides alike)."""
    return TrainConfig(
        arch_embedding_size=tuple(sizes), arch_sparse_feature_size=case.dim,
        arch_mlp_bot=case.bottom, arch_mlp_top=case.top, arch_interaction_op=case.interaction,
        dcn_num_layers=case.dcn_layers, dcn_low_rank_dim=case.dcn_rank,
        multi_hot_sizes=case.multi_hot, optimizer=case.optimizer, learning_rate=case.lr,
        mini_batch_size=batch, data_size=steps * batch, test_data_size=4096, precision=precision,
        seed=seed, out_dir=out_dir, progress=False, print_freq=0, compile=compile,
    )  # fmt: skip


class ConfigStep(OursStep):
    """bench_train's OursStep (our trainer's step with its generator) for any configuration."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.trainer = Trainer(cfg, checkpoints=False)
        self.batches = self.trainer.data.train.batches(0)


# --- the peer: torchrec's DLRM, the torchrec way ---------------------------------------------------


def process_group() -> None:
    """A gloo group of world size 1 for DistributedModelParallel (an in-memory store: no port)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def torchrec_model(case: Case, sizes) -> nn.Module:
    """torchrec's DLRMTrain around DLRM or DLRM_DCN, tables sharded by DistributedModelParallel
    with the sparse optimizer applied in backward (fused into fbgemm's kernel)."""
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    process_group()
    tables = [
        EmbeddingBagConfig(
            name=f"t_cat_{i}", embedding_dim=case.dim, num_embeddings=n, feature_names=[f"cat_{i}"]
        )  # fmt: skip
        for i, n in enumerate(sizes)
    ]
    # on "meta": DMP allocates the sharded tables itself, once
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    bottom, top = list(case.bottom[1:]), list(case.top)
    if case.interaction == "dcn":
        dlrm = DLRM_DCN(ebc, case.bottom[0], bottom, top, dcn_num_layers=case.dcn_layers,
                        dcn_low_rank_dim=case.dcn_rank)  # fmt: skip
    else:
        dlrm = DLRM(ebc, case.bottom[0], bottom, top)
    model = DLRMTrain(dlrm)
    sparse_opt, kwargs = sparse_optimizer(case)
    apply_optimizer_in_backward(sparse_opt, model.model.sparse_arch.parameters(), kwargs)
    # every table table-wise in fbgemm's fused kernel: left to itself the planner makes the small
    # tables data-parallel, dense tables updated outside the fused kernel and all-reduced
    constraints = {
        t.name: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
        for t in tables
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu", local_world_size=1),
        constraints=constraints,
    )
    plan = planner.plan(model, get_default_sharders())
    return DistributedModelParallel(module=model, device=torch.device("cpu"), plan=plan)


def sparse_optimizer(case: Case):
    if case.optimizer == "sgd":
        return torch.optim.SGD, {"lr": case.lr}
    return torch.optim.Adagrad, {"lr": case.lr, "eps": ADAGRAD_EPS}


def dense_optimizer(case: Case, dmp: nn.Module):
    """The parameters without an optimizer in backward, as torchrec's DLRM example steps them."""
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    if case.optimizer == "sgd":
        return KeyedOptimizerWrapper(params, lambda p: torch.optim.SGD(p, lr=case.lr))
    return KeyedOptimizerWrapper(
        params, lambda p: torch.optim.Adagrad(p, lr=case.lr, eps=ADAGRAD_EPS)
    )


def peer_tables(dmp: nn.Module) -> dict[str, torch.Tensor]:
    """The peer's tables by name: views of fbgemm's weights (world 1: one shard holds a table)."""
    prefix = "model.sparse_arch.embedding_bag_collection.embedding_bags."
    return {
        k[len(prefix) : -len(".weight")]: v.local_shards()[0].tensor
        for k, v in dmp.state_dict().items()
        if k.startswith(prefix)
    }


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def dot_columns(num_features: int) -> torch.Tensor:
    """For each of torchrec's interaction outputs (pairs i < j, row-major) the index of the same
    pair among ours (i > j, row-major), both after the dense vector's `dim` columns."""
    ours = {(i, j): p for p, (i, j) in
            enumerate((i, j) for i in range(num_features) for j in range(i))}  # fmt: skip
    pairs = [(i, j) for i in range(num_features) for j in range(i + 1, num_features)]
    return torch.tensor([ours[(j, i)] for i, j in pairs])


def weight_pairs(
    ours: nn.Module, dmp: nn.Module, case: Case
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours in the peer's layout, the peer's tensor) for every weight: linear layers in order
    (the top MLP's first layer's columns in torchrec's order of the dot products), cross kernels
    by name, tables by name. What `copy_weights` copies and the equivalence test compares."""
    peer = dmp.module.model
    linears = [*zip(_linears(ours.bottom_mlp), _linears(peer.dense_arch)),
               *zip(_linears(ours.top_mlp), _linears(peer.over_arch))]  # fmt: skip
    if len(linears) != len(case.bottom) + len(case.top) - 1:
        raise RuntimeError(f"{len(linears)} linear layers matched: the models differ")
    out = []
    for k, (mine, theirs) in enumerate(linears):
        weight = mine.weight.detach()
        if k == len(case.bottom) - 1 and case.interaction == "dot":  # the top's first layer
            cols = dot_columns(len(peer.sparse_arch.sparse_feature_names) + 1) + case.dim
            weight = torch.cat([weight[:, : case.dim], weight[:, cols]], dim=1)
        out += [(weight, theirs.weight), (mine.bias.detach(), theirs.bias)]
    if case.interaction == "dcn":
        theirs = dict(peer.inter_arch.crossnet.named_parameters())
        out += [(p.detach(), theirs[n]) for n, p in ours.interaction.crossnet.named_parameters()]
    tables = peer_tables(dmp)
    for spec, w in zip(ours.embeddings.tables, ours.embeddings.table_weights()):
        out.append((w.detach(), tables[spec.name]))
    return out


def copy_weights(ours: nn.Module, dmp: nn.Module, case: Case) -> None:
    """Our model's weights into the peer, so both train the same model."""
    with torch.no_grad():
        for mine, theirs in weight_pairs(ours, dmp, case):
            theirs.copy_(mine)


class PeerStep:
    """torchrec's step (zero the dense gradients, forward, backward with the fused sparse update,
    dense step), as its TrainPipelineBase runs it on CPU, through batches made beforehand."""

    def __init__(self, dmp: nn.Module, optimizer, batches: list, bf16: bool) -> None:
        self.dmp, self.optimizer, self.batches, self.bf16 = dmp, optimizer, batches, bf16
        self.i = 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            batch = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.step(batch)

    def step(self, batch) -> torch.Tensor:
        self.optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss, _ = self.dmp(batch)
        loss.backward()
        self.optimizer.step()
        return loss


def peer_batches(cfg: TrainConfig, n: int) -> list:
    """`n` batches of our generator for `cfg` (the same stream ours trains on), made now."""
    from dlrm.data import build_data

    stream = build_data(cfg).train.batches(0)
    return [next(stream) for _ in range(n)]


# --- the comparison --------------------------------------------------------------------------------

VARIANTS = {  # name -> (side, precision, --compile)
    "torchrec_fp32": ("torchrec", "fp32", None), "torchrec_bf16": ("torchrec", "bf16", None),
    "ours_fp32_eager": ("ours", "fp32", False), "ours_bf16_eager": ("ours", "bf16", False),
    "ours_fp32": ("ours", "fp32", None), "ours_bf16": ("ours", "bf16", None),
}  # fmt: skip
COMPILED = ("ours_fp32", "ours_bf16")  # may compile (cold: minutes)
# made before timing and reused in turn: their rows stay warmer in cache than ours' fresh stream,
# which favours the peer
PEER_BATCHES = 64


def build_steps(case: Case, sizes, bs: int, names: list[str], tmp: str) -> dict:
    steps: dict = {}
    for name in names:  # ours first: the peer starts from their initial weights
        side, precision, compile = VARIANTS[name]
        if side == "ours":
            cfg = train_config(
                case, sizes, bs, precision, f"{tmp}/{case.name}-{bs}-{name}", compile
            )
            steps[name] = ConfigStep(cfg)
    peers = [n for n in names if VARIANTS[n][0] == "torchrec"]
    if peers:
        cfg = train_config(case, sizes, bs, "fp32", f"{tmp}/{case.name}-{bs}-init", False)
        # every Trainer of one case starts from the same weights (same seed)
        init = next(iter(steps.values())).trainer if steps else Trainer(cfg, checkpoints=False)
        dmp = torchrec_model(case, sizes)
        copy_weights(init.model, dmp, case)
        del init
        # one model for both precisions: its tables once in memory
        opt, batches = dense_optimizer(case, dmp), peer_batches(cfg, PEER_BATCHES)
        for name in peers:
            steps[name] = PeerStep(dmp, opt, batches, bf16=VARIANTS[name][1] == "bf16")
    return {name: steps[name] for name in names}


def spread(xs: list[float]) -> float:
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m else 0.0


def compare(case: Case, sizes, bs: int, names: list[str], seconds: float, rounds: int,
            tmp: str) -> dict:  # fmt: skip
    """Every variant `rounds` times in turn; steps per round from each one's warm-up speed."""
    sampler = CpuSampler()
    steps = build_steps(case, sizes, bs, names, tmp)
    per_round: dict[str, int] = {}
    for name, step in steps.items():
        step.run(2)  # first touch of the tables, kernel caches, a compile
        t0 = time.perf_counter()
        step.run(2)
        rate = 2 / (time.perf_counter() - t0)
        per_round[name] = max(2, round(seconds * rate))
    runs: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    before = sampler.read()
    for _ in range(rounds):
        for name in names:
            rate, cpu_ms = timed(steps[name], per_round[name], bs)
            runs[name].append(rate)
            cpu[name].append(cpu_ms)
    after = sampler.read()
    med = statistics.median
    row: dict = {
        "table_rows": sum(sizes), "steps_per_round": per_round, "rounds": rounds,
        "others_busy_cpus": None if None in (before, after) else round(CpuSampler.others(before, after), 2),
    }  # fmt: skip
    for name in names:
        row[f"{name}_samples_per_s"] = round(med(runs[name]), 1)
        row[f"{name}_spread"] = round(spread(runs[name]), 3)
        row[f"{name}_cpu_ms_per_step"] = round(med(cpu[name]), 3)
    for name in names:
        side, precision, _ = VARIANTS[name]
        peer = f"torchrec_{precision}"
        if side == "ours" and peer in runs:
            ratios = [a / b for a, b in zip(runs[name], runs[peer])]
            row[f"{name}_vs_torchrec"] = round(med(ratios), 3)
            row[f"{name}_vs_torchrec_spread"] = round(spread(ratios), 3)
    row["all_rounds_samples_per_s"] = {n: [round(x, 1) for x in r] for n, r in runs.items()}
    return row


def versions() -> dict:
    import fbgemm_gpu
    import torchrec

    return {"torch": torch.__version__, "fbgemm_gpu": fbgemm_gpu.__version__,
            "torchrec": torchrec.__version__}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument(
        "--cases", default="dlrm_dot,dlrm_dcn", help="comma-separated: " + ", ".join(CASES)
    )
    p.add_argument(
        "--table-scale", type=float, default=1.0, help="scale of the Kaggle table sizes (dlrm_dot)"
    )
    p.add_argument(
        "--dcn-rows", type=int, default=100_000, help="rows per table at most (dlrm_dcn)"
    )
    p.add_argument("--batch-sizes", default="128,2048")
    p.add_argument(
        "--seconds", type=float, default=8.0, help="about how long each variant runs a round"
    )
    p.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds per case and batch size"
    )
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, measured in this order in every round",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    a.cases = [x for x in a.cases.split(",") if x]
    a.variants = [x for x in a.variants.split(",") if x]
    for flag, given, known in (("--cases", a.cases, CASES), ("--variants", a.variants, VARIANTS)):
        unknown = [x for x in given if x not in known]
        if unknown or not given:
            p.error(f"{flag}: unknown {', '.join(unknown) or 'nothing given'}; "
                    f"expected some of {', '.join(known)}")  # fmt: skip
    try:
        a.batch_sizes = [int(x) for x in a.batch_sizes.split(",") if x]
    except ValueError:
        p.error(f"--batch-sizes: expected comma-separated integers, got {a.batch_sizes!r}")
    checks = [("--table-scale", a.table_scale > 0), ("--dcn-rows", a.dcn_rows >= 2),
              ("--seconds", a.seconds > 0), ("--rounds", a.rounds >= 1),
              ("--batch-sizes", bool(a.batch_sizes) and min(a.batch_sizes) >= 1),
              ("--threads", a.threads >= 0)]  # fmt: skip
    for flag, ok in checks:
        if not ok:
            p.error(
                f"{flag}: expected a positive value, got {getattr(a, flag[2:].replace('-', '_'))}"
            )
    # the docs' walk (HYBRID_DLRM_QUICK): the same run at walk sizes, without a cold compile
    a.table_scale = quick.cap_scale("--table-scale", a.table_scale)
    a.dcn_rows = quick.cap("--dcn-rows", a.dcn_rows)
    a.seconds = quick.cap_scale("--seconds", a.seconds)
    a.rounds = quick.cap("--rounds", a.rounds)
    a.batch_sizes = sorted({quick.cap("--batch-sizes", bs) for bs in a.batch_sizes})
    if quick.active() and set(COMPILED) & set(a.variants):
        a.variants = [v for v in a.variants if v not in COMPILED]
        quick.note("the variants that may compile left out")
    quick.announce(PROG)
    return a


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    result: dict = {
        "bench": "vs_torchrec",
        "peer": "torchrec DLRMTrain(DLRM / DLRM_DCN), DistributedModelParallel (gloo, world 1, "
        "CPU; every table table_wise in the fused kernel), fbgemm's table-batched embeddings with "
        "the sparse optimizer in backward, dense "
        "optimizer by KeyedOptimizerWrapper; batches made before timing",
        "ours": "dlrm.Trainer's step with its synthetic generator (generation counted)",
        "variants": a.variants, "peer_batches": PEER_BATCHES, "versions": versions(),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "cpu": cpu_model(), "cpu_flags": cpu_flags()},
        "load_average_before": load_average(), "cases": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-vs-torchrec-") as tmp:
        for name in a.cases:
            case = CASES[name]
            sizes = table_sizes(case, a.table_scale, a.dcn_rows)
            out = result["cases"][name] = {
                "embedding_dim": case.dim, "bottom": list(case.bottom), "top": list(case.top),
                "interaction": case.interaction, "optimizer": case.optimizer, "lr": case.lr,
                "ids_per_sample": sum(case.multi_hot) if case.multi_hot else len(sizes),
                "batches": {},
            }  # fmt: skip
            for bs in a.batch_sizes:
                row = compare(case, sizes, bs, a.variants, a.seconds, a.rounds, tmp)
                out["batches"][str(bs)] = row
                print(json.dumps({name: {bs: row}}), file=sys.stderr, flush=True)
    result["load_average_after"] = load_average()
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
