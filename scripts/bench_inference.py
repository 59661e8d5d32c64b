#!/usr/bin/env python
"""Low-precision inference, measured: bytes, accuracy and CPU speed per precision, and raw-line
prediction against preprocessing (issue 23). Prints one JSON object.

Two trained models:
- `kaggle_planted`: the Kaggle recipe (scripts/bench_kaggle.sh: dim 16, 13-512-256-64-16 /
  512-256-1, batch 128, lr 0.1, SGD, one epoch) on a planted Criteo-format raw file
  (data_pipeline/synthetic_raw.py), frequency-mode ids; test = the first half of day 6;
- `synthetic_default`: `python -m dlrm.train`'s default (the embedded synthetic data set),
  `--num-batches` steps.

Per model, artifacts at fp32, fp16, int8, int4, int2 tables (fp32 MLPs), int8 tables + int8
MLPs ("int8"), fp32 tables + bf16 MLPs ("bf16_mlp") and `auto` (default budget, fp32 MLPs):
table and model bytes (counted), test AUC and NE (the whole test split), then CPU samples/s at
batch 2048 (wall and CPU time) and latency p50/p99 at batch 1 and 64, the models and their
GEMM-only bounds (`GemmOnly`) timed in interleaved rounds in this process (the order rotates
each round). Finally `python -m hybrid_dlrm.serving.predict` on a 1M-line raw file, lines/s end to end (wall
and CPU seconds), against preprocessing the same lines (`python -m data_pipeline`'s work, in
the artifact's mapping mode), alternated in rounds, and prediction's CPU floor
(`predict_cpu_floor`).

    python scripts/bench_inference.py --work /tmp/bench_inference [--rounds 5]

The work directory keeps the raw files, runs and artifacts: a rerun reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle, write_raw_file
from hybrid_dlrm.common import quick
from hybrid_dlrm.serving.artifact import read_manifest

ROOT = Path(__file__).resolve().parent.parent
KAGGLE_ARCH = ["--arch-sparse-feature-size", "16", "--arch-mlp-bot", "13-512-256-64-16",
               "--arch-mlp-top", "512-256-1", "--arch-interaction-op", "dot"]  # fmt: skip
VARIANTS = {  # name: quantize flags
    "fp32": ["--emb-precision", "fp32"],
    "fp16": ["--emb-precision", "fp16"],
    "int8_tables": ["--emb-precision", "int8"],
    "int4": ["--emb-precision", "int4"],
    "int2": ["--emb-precision", "int2"],
    "int8": ["--emb-precision", "int8", "--mlp-precision", "int8"],
    "bf16_mlp": ["--emb-precision", "fp32", "--mlp-precision", "bf16"],
    "auto": ["--emb-precision", "auto"],
}
TIMED = ("fp32", "int8_tables", "int8", "bf16_mlp", "auto")


def machine() -> dict:
    flags = ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Flags:"):
                flags = line
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        model = platform.processor()
    wanted = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx_vnni")
    return {
        "cpu": model,
        "flags": [f for f in wanted if f" {f}" in flags],
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "quantized_engine": torch.backends.quantized.engine,
    }


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_cli(module: str, args: list[str], threads: int | None = None) -> None:
    """A CLI in a child process (its own torch threads and memory), failing loudly. `threads`:
    its intra-op threads (training and export use 1: on a shared machine, threads that wait on a
    descheduled sibling made 2-thread training 10x slower; nothing timed runs there)."""
    cmd = [sys.executable, "-m", module, *args]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads)) if threads else None
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")


# --- models and artifacts ----------------------------------------------------------------------


def train_kaggle(work: Path, lines_per_day: int) -> tuple[Path, Path]:
    raw = work / "raw"
    if not (raw / "train.txt").is_file():
        write_kaggle(raw, 7 * lines_per_day, 0, SyntheticSpec(seed=23))
    run, proc = work / "run_kaggle", work / "proc_kaggle"
    if not (run / "summary.json").is_file():
        shutil.rmtree(run, ignore_errors=True)
        run_cli("dlrm.train", ["--data-set", "kaggle", "--raw-data-file", str(raw / "train.txt"),
                               "--processed-data-file", str(proc), *KAGGLE_ARCH,
                               "--mini-batch-size", "128", "--test-mini-batch-size", "16384",
                               "--learning-rate", "0.1", "--optimizer", "sgd", "--nepochs", "1",
                               "--print-freq", "1024", "--out-dir", str(run)], threads=1)  # fmt: skip
    return run, proc


def train_synthetic(work: Path, batches: int) -> Path:
    run = work / "run_synthetic"
    if not (run / "summary.json").is_file():
        shutil.rmtree(run, ignore_errors=True)
        run_cli("dlrm.train", ["--num-batches", str(batches), "--out-dir", str(run)], threads=1)
    return run


def export_all(run: Path, out: Path, names=tuple(VARIANTS)) -> dict[str, Path]:
    """The artifacts, exported in this process by `python -m hybrid_dlrm.serving.quantize`'s
    library face (its imports paid once, not per variant; nothing of an export is timed but
    their total, `export_s`), with the command's calibration batches at walk sizes."""
    from hybrid_dlrm.serving.quantize import build_parser, quantize

    batches = []
    if quick.active():
        batches = ["--batches", str(quick.cap("--batches", build_parser().get_default("batches")))]
    arts = {}
    for name in names:
        art = out / name
        if not (art / "manifest.json").is_file():
            shutil.rmtree(art, ignore_errors=True)
            quantize([str(run), "--out", str(art), *VARIANTS[name], *batches])
        arts[name] = art
    return arts


def accuracy(arts: dict[str, Path], test_batches) -> dict:
    from hybrid_dlrm.serving import Predictor
    from hybrid_dlrm.serving.quantize import metrics_of

    out = {}
    fp32_tables = fp32_model = None
    for name, art in arts.items():
        p = Predictor.load(art)
        m = p.manifest
        logits = torch.cat([p.logits(b) for b in test_batches])
        labels = torch.cat([b.labels for b in test_batches])
        met = metrics_of(logits, labels)
        b = m["bytes"]
        if name == "fp32":
            fp32_tables, fp32_model = b["table_bytes"], b["model_bytes"]
        out[name] = {
            "table_precisions": sorted({t["precision"] for t in m["tables"]}),
            "mlp_precision": m["dense"]["precision"],
            "table_bytes": b["table_bytes"],
            "model_bytes": b["model_bytes"],
            "test_auc": met["auc"],
            "test_ne": met["ne"],
            "test_samples": met["samples"],
        }
        if m.get("precision_search"):
            out[name]["calibration_ne_change"] = m["calibration"]["ne_change"]
            out[name]["choice"] = {t["feature"]: t["precision"] for t in m["tables"]}
    ref = out["fp32"]
    for r in out.values():
        r["table_share_of_fp32"] = r["table_bytes"] / fp32_tables
        r["model_share_of_fp32"] = r["model_bytes"] / fp32_model
        r["auc_loss"] = ref["test_auc"] - r["test_auc"]
        r["ne_change"] = r["test_ne"] / ref["test_ne"] - 1
    return out


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


class GemmOnly:
    """The matrix products of one inference forward and nothing else, in the layouts the model
    runs them: per linear layer its forward addmm (fp32: `perfmodel.sweeps.linear_gemms`'s, as
    `NarrowInputLinear` and `PaddedInputLinear` run it; bf16: `Bf16Linear`'s oneDNN linear,
    input unpadded; int8: the dynamic int8 Linear, activation quantization included), and the dot
    interaction's bmm (`_DotInteractionFn`; fp32 for int8). No model running these
    products with these kernels is faster, so fp32 model / bf16 GEMM-only bounds what the
    bf16-MLP model can gain over fp32 (scripts/bench_train.py's GemmOnlyStep is the training
    analogue)."""

    def __init__(self, arch, batch: int, precision: str) -> None:
        from dlrm.models.quantized import Bf16Linear
        from perfmodel.sweeps import linear_gemms

        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.calls = []
        for widths in (arch.bottom, (arch.top_input, *arch.top)):
            for fi, fo in zip(widths[:-1], widths[1:]):
                if precision == "fp32":
                    self.calls.append(linear_gemms(batch, fi, fo, dtype)[0][2])
                elif precision == "int8":  # torch's dynamic int8 Linear, as the int8 model's
                    from dlrm.models.quantized import _int8_linear

                    q, x = (
                        _int8_linear(torch.randn(fo, fi), torch.randn(fo)),
                        torch.randn(batch, fi),
                    )
                    self.calls.append(lambda q=q, x=x: q(x))
                else:  # Bf16Linear's kernel, without its fused ReLU
                    m, x = (
                        Bf16Linear(torch.randn(fo, fi), torch.randn(fo), False),
                        torch.randn(batch, fi),
                    )
                    self.calls.append(lambda m=m, x=x.to(dtype): m(x))
        n = arch.num_sparse + 1
        t_t = torch.randn(batch, arch.embedding_dim, n).to(dtype)
        self.calls.append(lambda: torch.bmm(t_t.transpose(1, 2), t_t))

    def logits(self, _batch) -> None:
        for call in self.calls:
            call()


def speed(arts: dict[str, Path], batch2048, rounds: int) -> dict:
    """Interleaved rounds; each round times every model (and the GEMM-only bounds) once, in a
    rotating order. Wall time, and the process's CPU time (one thread: on this shared machine a
    round's wall time includes other processes' time slices; CPU time does not)."""
    from embeddings.kjt_ops import select_inputs
    from hybrid_dlrm.serving import Predictor

    predictors = {n: Predictor.load(arts[n]) for n in TIMED}
    arch = predictors["fp32"].model.arch
    bounds = {f"gemm_only_{p}": GemmOnly(arch, 2048, p) for p in ("fp32", "bf16")}
    small = {}
    for k in (1, 64):
        idx = np.arange(k)
        small[k] = [(b.dense_features[:k].contiguous(), select_inputs(b.sparse_features, idx))
                    for b in batch2048]  # fmt: skip
    big = [(b.dense_features, b.sparse_features) for b in batch2048]
    names = list(TIMED) + list(bounds)
    runners = {**predictors, **bounds}
    rates = {n: [] for n in names}
    cpu_rates = {n: [] for n in names}
    lat = {n: {1: [], 64: []} for n in TIMED}
    for p in runners.values():  # warm-up: oneDNN kernels, first-call allocations
        for x in big[:2] + small[1][:2] + small[64][:2]:
            p.logits(x)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            p = runners[n]
            t0, c0 = time.perf_counter(), time.process_time()
            for x in big:
                p.logits(x)
            rates[n].append(len(big) * 2048 / (time.perf_counter() - t0))
            cpu_rates[n].append(len(big) * 2048 / (time.process_time() - c0))
            if n in bounds:
                continue
            for k, reps in ((1, 200), (64, 50)):
                for i in range(reps):
                    x = small[k][i % len(small[k])]
                    t = time.perf_counter()
                    p.logits(x)
                    lat[n][k].append((time.perf_counter() - t) * 1e3)
    out = {}
    for n in names:
        out[n] = {"samples_per_s_batch_2048": _stats(rates[n]),
                  "samples_per_cpu_s_batch_2048": _stats(cpu_rates[n])}  # fmt: skip
        if n in bounds:
            continue
        for k in (1, 64):
            a = np.array(lat[n][k])
            out[n][f"batch_{k}_ms"] = {"p50": float(np.percentile(a, 50)),
                                       "p99": float(np.percentile(a, 99)), "n": len(a)}  # fmt: skip
    base = statistics.median(rates["fp32"])
    for n in names:
        # ratio per round (same round, adjacent in time), then the median of the ratios
        out[n]["speedup_vs_fp32"] = _stats([a / b for a, b in zip(rates[n], rates["fp32"])])
        out[n]["cpu_speedup_vs_fp32"] = _stats(
            [a / b for a, b in zip(cpu_rates[n], cpu_rates["fp32"])]
        )
        out[n]["median_speedup"] = statistics.median(rates[n]) / base
    # the most any model running these products could gain over the fp32 model
    out["bf16_ceiling"] = {"speedup_vs_fp32": out["gemm_only_bf16"]["speedup_vs_fp32"],
                           "cpu_speedup_vs_fp32": out["gemm_only_bf16"]["cpu_speedup_vs_fp32"]}  # fmt: skip
    return out


def bench_model(
    name: str, run: Path, work: Path, test_source, rounds: int, timing_batches: int
) -> dict:
    t0 = time.perf_counter()
    arts = export_all(run, work / f"artifacts_{name}")
    exported = time.perf_counter() - t0

    test = [test_source.batch(0, i) for i in range(len(test_source))]
    acc = accuracy(arts, test)
    batch2048 = [test[i % len(test)] for i in range(timing_batches)]
    load_before = load()
    spd = speed(arts, batch2048, rounds)
    summary = json.loads((run / "summary.json").read_text())
    fp32, int8, auto = acc["fp32"], acc["int8_tables"], acc["auto"]
    targets = {
        "int8_table_bytes_share (<= 0.32 at dim 16)": [int8["table_share_of_fp32"], int8["table_share_of_fp32"] <= 0.32],
        "int8_auc_loss (<= 0.0005)": [int8["auc_loss"], int8["auc_loss"] <= 0.0005],
        "int4_table_bytes_share (<= 0.19 at dim 16)": [acc["int4"]["table_share_of_fp32"], acc["int4"]["table_share_of_fp32"] <= 0.19],
        "int4_auc_loss (<= 0.002)": [acc["int4"]["auc_loss"], acc["int4"]["auc_loss"] <= 0.002],
        "auto_model_bytes_share (<= 0.25)": [auto["model_share_of_fp32"], auto["model_share_of_fp32"] <= 0.25],
        "auto_test_ne_change (<= 0.001)": [auto["ne_change"], auto["ne_change"] <= 0.001],
        "int8_model_speedup_batch_2048 (>= 1.5)": [spd["int8"]["speedup_vs_fp32"]["median"], spd["int8"]["speedup_vs_fp32"]["median"] >= 1.5],
        "bf16_mlp_speedup_batch_2048 (>= 2 with bf16 units)": [spd["bf16_mlp"]["speedup_vs_fp32"]["median"], spd["bf16_mlp"]["speedup_vs_fp32"]["median"] >= 2.0],
        "bf16_mlp_cpu_speedup_batch_2048 (>= 2 with bf16 units)": [spd["bf16_mlp"]["cpu_speedup_vs_fp32"]["median"], spd["bf16_mlp"]["cpu_speedup_vs_fp32"]["median"] >= 2.0],
        "bf16_ceiling: fp32 model / bf16 GEMM-only": [spd["bf16_ceiling"]["speedup_vs_fp32"]["median"], spd["bf16_ceiling"]["cpu_speedup_vs_fp32"]["median"]],
    }  # fmt: skip
    return {
        "trained": {
            k: summary.get(k) for k in ("steps", "samples", "test_auc", "test_ne", "wall_s")
        },
        "fp32_test_auc": fp32["test_auc"],
        "export_s": round(exported, 1),
        "models": acc,
        "speed": spd,
        "load_during_timing": [load_before, load()],
        "targets": targets,
    }


# --- raw-line prediction vs preprocessing ------------------------------------------------------------


def _child_cpu_s() -> float:
    """CPU seconds (user + system) of every finished child process and its own children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


PREDICT_VARIANTS = ("predict_labelled", "predict_labelled_2_threads", "predict_unlabelled",
                    "preprocess_labelled")  # fmt: skip


def bench_predict(work: Path, art: Path, lines: int, rounds: int) -> dict:
    """`python -m hybrid_dlrm.serving.predict` end to end (process start, verification, parse, map, score,
    write) against `python -m data_pipeline preprocess` of the same lines in the artifact's
    mapping mode (count pass, encode pass, writing the columns), alternated in rounds with the
    order reversed every other round. Wall seconds, and CPU seconds of each process tree (what
    a loaded machine cannot inflate the way it does wall time)."""
    spec = SyntheticSpec(seed=23)
    raw = work / "predict_raw"
    raw.mkdir(exist_ok=True)
    test_txt, train_txt = raw / "test.txt", raw / "train.txt"
    if not test_txt.is_file():
        write_raw_file(test_txt, lines, spec, stream=7, with_label=False)
    if not train_txt.is_file():
        write_raw_file(train_txt, lines, spec, stream=7)
    manifest = read_manifest(art)
    mode = manifest["categorical"]
    prep_flags = (["--max-ind-range", str(mode["max_ind_range"])] if mode["mode"] == "hash"
                  else ["--frequency-threshold", str(mode["threshold"])])  # fmt: skip
    wall: dict[str, list[float]] = {w: [] for w in PREDICT_VARIANTS}
    cpu: dict[str, list[float]] = {w: [] for w in PREDICT_VARIANTS}
    loads = [load()]
    for r in range(rounds):
        for what in PREDICT_VARIANTS if r % 2 == 0 else reversed(PREDICT_VARIANTS):
            if what.endswith("2_threads") and r > 0:  # once: 3-4x slower here (docs/inference.md)
                continue
            out = work / "predict_out"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            c0, t0 = _child_cpu_s(), time.perf_counter()
            if what == "preprocess_labelled":
                run_cli("data_pipeline", ["preprocess", "--dataset", "kaggle", "--raw", str(train_txt),
                                          "--out", str(out / "p"), "--no-progress", *prep_flags])  # fmt: skip
            else:
                data = test_txt if what == "predict_unlabelled" else train_txt
                threads = "2" if what.endswith("2_threads") else "1"
                run_cli("hybrid_dlrm.serving.predict", ["--model", str(art), "--data", str(data), "--threads",
                                         threads, "--out", str(out / "preds.csv")])  # fmt: skip
            wall[what].append(time.perf_counter() - t0)
            cpu[what].append(_child_cpu_s() - c0)
        loads.append(load())
    shutil.rmtree(work / "predict_out", ignore_errors=True)
    out = {"lines": lines, "bytes": train_txt.stat().st_size, "mapping": mode["mode"],
           "artifact": art.name, "rounds": rounds, "load_per_round": loads}  # fmt: skip
    for what in PREDICT_VARIANTS:
        out[what] = {"wall_s": _stats(wall[what]), "cpu_s": _stats(cpu[what]),
                     "lines_per_s": lines / statistics.median(wall[what]),
                     "lines_per_cpu_s": lines / statistics.median(cpu[what])}  # fmt: skip
    out["predict_cpu_floor"] = predict_cpu_floor(art, train_txt, lines)
    base = wall["preprocess_labelled"]
    for what in PREDICT_VARIANTS[:-1]:
        # per round (adjacent runs), then the median: preprocessing's wall time / predict's
        out[what]["speed_vs_preprocessing"] = _stats([b / a for a, b in zip(wall[what], base)])
    ratio = out["predict_labelled"]["speed_vs_preprocessing"]["median"]
    out["target: predict not slower than preprocessing"] = [ratio, ratio >= 1.0]
    floor = out["predict_cpu_floor"]["total_cpu_s"]
    out["predict_cpu_floor"]["vs_preprocessing_cpu_s"] = floor / statistics.median(
        cpu["preprocess_labelled"]
    )
    return out


_PARSE_PASS = """
import sys
from pathlib import Path
from data_pipeline.block_pipeline import BadLineLog
from data_pipeline.preprocess_worker import TaskSpec, init_worker, run_task
from data_pipeline.raw_files import RawPart, iter_blocks
init_worker()  # as in the workers
spec = TaskSpec("encode", True, 0.0, 0, int(sys.argv[2]), sys.argv[3] or None, "int32")
part = RawPart("floor", Path(sys.argv[1]), has_label=True)
bad = BadLineLog(part, "error")
for block in iter_blocks(part, 2 << 20):
    bad.take(run_task(spec, block.lines(), block.offset))
"""


def predict_cpu_floor(art: Path, raw: Path, lines: int) -> dict:
    """CPU seconds no `python -m hybrid_dlrm.serving.predict` of these lines can go below with these kernels and
    this parser: its start (interpreter, imports, loading and verifying the artifact), one
    parse-and-map pass over the lines (the preprocessing workers' `run_task`, inline; each in a
    child process), and the int8 model's GEMM-only work for every line (`GemmOnly`, 16 batches
    of 2048 timed and scaled). Preprocessing makes two parse passes (counting, then encoding)."""
    from hybrid_dlrm.serving import Predictor

    def child_cpu(args: list[str]) -> float:
        c0 = _child_cpu_s()
        subprocess.run([sys.executable, *args], cwd=ROOT, check=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
        return _child_cpu_s() - c0

    start = child_cpu(
        [
            "-c",
            f"import hybrid_dlrm.serving.predict; from hybrid_dlrm.serving import Predictor; Predictor.load({str(art)!r})",
        ]
    )
    mapping = read_manifest(art)["categorical"]
    hashed = mapping["mode"] == "hash"
    parse = child_cpu(["-c", _PARSE_PASS, str(raw), str(mapping["max_ind_range"] if hashed else 0),
                       "" if hashed else str(art / mapping["dir"])])  # fmt: skip
    gemm = GemmOnly(Predictor.load(art).model.arch, 2048, "int8")
    gemm.logits(None)
    c0 = time.process_time()
    for _ in range(16):
        gemm.logits(None)
    gemms = (time.process_time() - c0) / (16 * 2048) * lines
    return {"start_cpu_s": start, "parse_and_map_pass_cpu_s": parse, "int8_gemm_only_cpu_s": gemms,
            "total_cpu_s": start + parse + gemms}  # fmt: skip


def walk_sizes(a: argparse.Namespace, prog: str) -> None:
    """HYBRID_DLRM_QUICK (hybrid_dlrm/common/quick.py): the docs' walk runs this at its sizes
    (the trainings it starts cut their own steps)."""
    if quick.active():
        a.lines_per_day = quick.cap("--lines-per-day", a.lines_per_day, like="--lines")
        a.synthetic_batches = quick.cap(
            "--synthetic-batches", a.synthetic_batches, like="--num-batches"
        )
        a.rounds = quick.cap("--rounds", a.rounds)
        a.timing_batches = quick.cap("--timing-batches", a.timing_batches, like="--rounds")
        a.predict_lines = quick.cap("--predict-lines", a.predict_lines, like="--lines")
        a.predict_rounds = quick.cap("--predict-rounds", a.predict_rounds, like="--rounds")
        quick.announce(prog)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="/tmp/bench_inference")
    p.add_argument("--lines-per-day", type=int, default=50_000, help="planted Kaggle file: 7 days")
    p.add_argument("--synthetic-batches", type=int, default=400)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--timing-batches", type=int, default=4, help="batches of 2048 per round")
    p.add_argument("--predict-lines", type=int, default=1_000_000)
    p.add_argument("--predict-rounds", type=int, default=5)
    p.add_argument("--only", default="kaggle,synthetic,predict")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads for timing and predict (a shared machine: 1; see docs)")  # fmt: skip
    a = p.parse_args()
    walk_sizes(a, "scripts/bench_inference.py")
    torch.set_num_threads(a.threads)
    work = Path(a.work).resolve()  # the children run in the checkout
    work.mkdir(parents=True, exist_ok=True)
    only = set(a.only.split(","))
    result = {"machine": machine(), "load_at_start": load(), "args": vars(a)}

    def keep(section: str, value: dict) -> None:  # each section also on disk as it finishes
        result[section] = value
        (work / f"result_{section}.json").write_text(json.dumps(value, indent=1) + "\n")

    if "kaggle" in only or "predict" in only:
        run, proc = train_kaggle(work, a.lines_per_day)
        from data_pipeline.criteo import CriteoBatchSource

        if "kaggle" in only:
            test = CriteoBatchSource(proc, "test", 2048)
            keep(
                "kaggle_planted", bench_model("kaggle", run, work, test, a.rounds, a.timing_batches)
            )
        if "predict" in only:
            art = export_all(run, work / "artifacts_kaggle", ["int8"])["int8"]
            keep("predict", bench_predict(work, art, a.predict_lines, a.predict_rounds))
    if "synthetic" in only:
        run = train_synthetic(work, a.synthetic_batches)
        from hybrid_dlrm.serving.inference_data import data_source, load_source

        source = load_source(run)
        test = data_source(source, None, "test", 2048)
        keep(
            "synthetic_default",
            bench_model("synthetic", run, work, test, a.rounds, a.timing_batches),
        )
    result["load_at_end"] = load()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
