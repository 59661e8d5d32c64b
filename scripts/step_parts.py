"""Where a training step's time goes, part by part: the bound issue 47 part 3 asks to show
before the step is made faster (the whole step against its dense part alone).

    python scripts/step_parts.py                                  # b128 and b2048, fp32 and bf16
    python scripts/step_parts.py --table-scale 0.01 --steps 5     # quick

For each batch size and precision: our Trainer on the synthetic Kaggle-sized tables (the
reference MLPs, dim 16), eager (`--compile=false`: the profiler sees every operator; a compiled
step fuses the dense part, which `scripts/bench_train.py` measures whole), `--warmup` steps,
then `--steps` steps under torch.profiler with the pipeline's phase labels (perfmodel/profiling.py,
the fit traces' own recorder). Each top-level operator of a step is put in one part by its name
and phase (`PARTS`, first match wins): the dense GEMMs, the interaction, the embedding lookup
(forward, backward and fused update), dtype casts, the loss, the dense optimizer, the rest
(activations, concatenations, autograd bookkeeping); `step_us - sum(parts)` is the time between
operators (Python, the pipeline). Prints one JSON object: per case the median step, each part's
median microseconds and share, the "other" part's largest operators (mean per step), the CPU
flags and the load average.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _shared import load_average  # noqa: E402

from data_pipeline.synthetic import KAGGLE_TABLE_SIZES  # noqa: E402
from dlrm import TrainConfig, Trainer  # noqa: E402
from perfmodel import hardware  # noqa: E402
from perfmodel.graph import batches_for  # noqa: E402
from perfmodel.profiling import profile_steps, run_steps  # noqa: E402

# (part, the phase it must be in or None, substrings of the operator's name): first match wins
PARTS = [
    ("optimizer", "optimizer", ()),
    ("embedding", "embedding_lookup", ()),
    ("embedding", None, ("fbgemm", "Embedding", "embedding", "Lookup")),
    ("interaction", None, ("Interaction", "bmm", "Bmm", "tril", "triu", "index", "Index")),
    ("casts", None, ("_to_copy", "aten::to", "ToCopy", "aten::copy_", "CopyBackwards")),
    ("gemm", None, ("addmm", "Addmm", "linear", "Linear", "aten::mm", "MmBackward", "matmul")),
    ("loss", None, ("binary_cross_entropy", "BinaryCrossEntropy", "sigmoid", "Sigmoid", "mse")),
]


def part_of(op: dict) -> str:
    for part, phase, words in PARTS:
        if phase is not None and op.get("phase") == phase:
            return part
        if words and any(w in op["name"] for w in words):
            return part
    return "other"


def config(batch: int, precision: str, scale: float, out: Path) -> TrainConfig:
    sizes = [max(1, int(n * scale)) for n in KAGGLE_TABLE_SIZES]
    return TrainConfig(
        arch_embedding_size=tuple(sizes), arch_sparse_feature_size=16,
        arch_mlp_bot="13-512-256-64-16", arch_mlp_top="512-256-1", mini_batch_size=batch,
        data_size=batch * 64, test_data_size=batch, precision=precision, compile=False,
        device="cpu", print_freq=10**6, progress=False, out_dir=str(out),
    )  # fmt: skip


def measure(cfg: TrainConfig, warmup: int, steps: int) -> dict:
    trainer = Trainer(cfg, checkpoints=False)
    batch = cfg.training.mini_batch_size
    batches = batches_for(trainer, batch, warmup + steps)
    run_steps(trainer.pipeline, batches[:warmup])
    graphs = profile_steps(trainer.pipeline, batches[warmup:], uses_cuda=False)
    per_step: list[dict[str, float]] = []
    others: dict[str, float] = {}  # the "other" part's operators, summed over the steps
    for g in graphs:
        parts: dict[str, float] = {}
        for op in g["ops"]:
            if op.get("thread") not in (None, g["ops"][0].get("thread")):
                continue  # another thread's (a worker's): not on the step's critical path
            name = part_of(op)
            parts[name] = parts.get(name, 0.0) + float(op["dur_us"])
            if name == "other":
                others[op["name"]] = others.get(op["name"], 0.0) + float(op["dur_us"])
        parts["between_ops"] = max(0.0, float(g["dur_us"]) - sum(parts.values()))
        parts["step"] = float(g["dur_us"])
        per_step.append(parts)
    names = sorted({k for p in per_step for k in p if k != "step"})
    step = statistics.median(p["step"] for p in per_step)
    med = {k: statistics.median(p.get(k, 0.0) for p in per_step) for k in names}
    return {
        "step_us": round(step, 1),
        "samples_per_s": round(batch / step * 1e6, 1),
        "parts_us": {k: round(v, 1) for k, v in sorted(med.items(), key=lambda x: -x[1])},
        "parts_share": {k: round(v / step, 4) for k, v in sorted(med.items(), key=lambda x: -x[1])},
        "outside_gemm_share": round(1 - med.get("gemm", 0.0) / step, 4),
        "other_top_us": {k: round(v / len(graphs), 1)
                         for k, v in sorted(others.items(), key=lambda x: -x[1])[:8]},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="128,2048")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--table-scale", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out: dict = {
        "bench": "step_parts", "threads": torch.get_num_threads(),
        "cpu_flags": hardware.cpu_flags(),
        "load_before": load_average(), "table_scale": args.table_scale, "cases": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="step-parts-") as tmp:
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for precision in args.precisions.split(","):
                cfg = config(batch, precision, args.table_scale, Path(tmp) / f"{precision}-{batch}")
                case = measure(cfg, args.warmup, args.steps)
                out["cases"][f"b{batch}-{precision}"] = case
                print(f"b{batch} {precision}: {json.dumps(case)}", file=sys.stderr, flush=True)
    out["load_after"] = load_average()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
