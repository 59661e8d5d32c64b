"""Slipstream benchmark: baseline vs Slipstream vs the random control at the same skip share.

    python scripts/bench_slipstream.py --out bench/slipstream          # the default run (CPU)
    python scripts/bench_slipstream.py --seeds 1 --data synthetic      # a quick look

Two data sets, each trained per seed three ways in one round (baseline, Slipstream, then the
random control dropping the share of inputs Slipstream dropped after its warm-up), the rounds
interleaved so the machine's drift hits every variant alike:
- `synthetic`: the Kaggle-shaped synthetic data (`--data-set synthetic`, Zipf 1.05, tables at
  1% of Kaggle's), one epoch;
- `criteo`: a planted Criteo-format raw file (`data_pipeline/synthetic_raw.py`) preprocessed with
  the Kaggle recipe (7 days, the last one split into test and validation), three epochs; the
  one-epoch figures are the same runs at the end of their first epoch (nothing in a run depends
  on how many epochs follow: the learning rate is constant).
Then a curve of skip share vs AUC change over a few target skip shares (`--curve`, first seed),
and Slipstream on top of Hotline (`--hotline-seeds`, synthetic data). `--normalize 1` adds two
variants to every round: Slipstream with `--slipstream-normalize`, and the same with nothing
skipped (threshold 0), so that what normalisation wins back is told apart from what it changes
in the model; `--control 0` leaves the random control out.

Reported per variant: final test AUC, training time (evaluation excluded), steps, samples
trained and skipped, the time to reach the baseline's final AUC minus 0.001 (from evaluations
every `--evals-per-epoch`th of an epoch), and against the baseline the time ratio (median and
spread over seeds), the AUC difference (mean and spread) and for the control the difference to
Slipstream. The stale share of the tracked rows at every snapshot is plotted with the curve
(PNG beside the JSON). Prints one JSON object; `--out DIR` also writes it there.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _shared

from _shared import check_bench_out, cpu_flags, load_average  # noqa: E402

from dlrm import TrainConfig, Trainer  # noqa: E402
from hybrid_dlrm.common import quick  # noqa: E402

AUC_MARGIN = 0.001


def criteo_data(work: Path, lines: int) -> Path:
    """A planted Kaggle-layout raw file, preprocessed with the Kaggle recipe (reused if there)."""
    from data_pipeline.preprocess import ensure_preprocessed
    from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle

    raw = work / "raw" / "train.txt"
    if not raw.is_file():
        write_kaggle(raw.parent, lines, 0, SyntheticSpec(seed=7))
    return ensure_preprocessed("kaggle", raw, work / "kaggle.processed", seed=0)


def cpu_clock(trainer: Trainer) -> tuple[list[float], list[float]]:
    """The process CPU time the trainer's steps take (data, Slipstream's work and the step;
    evaluation excluded) and its value at each evaluation: the load-robust training time (the
    run's threads: one torch thread, one numba thread, the data's reader)."""
    total, at_eval = [0.0], []
    step, evaluate = trainer._step, trainer._evaluate_and_checkpoint

    def timed_step(batches):
        t0 = time.process_time()
        try:
            return step(batches)
        finally:
            total[0] += time.process_time() - t0

    def timed_evaluate():
        at_eval.append(total[0])
        return evaluate()

    trainer._step, trainer._evaluate_and_checkpoint = timed_step, timed_evaluate
    return total, at_eval


def run(cfg: TrainConfig) -> dict:
    t0 = time.perf_counter()
    trainer = Trainer(cfg, checkpoints=False)
    cpu, cpu_at_eval = cpu_clock(trainer)
    summary = trainer.fit()
    events = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    # (CPU seconds, AUC, step, epoch, wall seconds of training) at each evaluation
    evals = [(round(c, 3), e["test_auc"], e["step"], e["epoch"], round(e["train_time_s"], 3))
             for c, e in zip(cpu_at_eval, (e for e in events if e["event"] == "eval"))]  # fmt: skip
    out = {
        "test_auc": summary["test_auc"], "cpu_s": round(cpu[0], 3),
        "wall_s": round(summary["wall_s"], 3), "steps": summary["steps"],
        "samples": summary["samples"], "evals": evals, "run_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    s = summary.get("slipstream")
    if s:
        out["slipstream"] = s
        out["history"] = trainer.pipeline.history  # [step, threshold, stale share, median drift]
        pre = cfg.slipstreaming.warmup * cfg.training.mini_batch_size
        seen = s["samples_trained"] + s["samples_skipped"]
        out["skip_share_after_warmup"] = s["samples_skipped"] / max(1, seen - pre)
        out["all_tracked_input_share"] = all_tracked_share(trainer)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    return out


def all_tracked_share(trainer: Trainer, batches: int = 8) -> dict:
    """Share of inputs whose every lookup is a tracked row (no threshold can skip more), in
    source batches the access profile read and in others (the first `batches` of each)."""
    import torch

    from embeddings.hot_inputs import all_hot_given_cold

    tr, profiled, src = (
        trainer.pipeline.tracker,
        trainer.pipeline.profiled,
        trainer.data.train,
    )
    out = {}
    for name, pick in (
        ("profiled", lambda j: j in profiled),
        ("other", lambda j: j not in profiled),
    ):
        hits = seen = 0
        for j in [j for j in range(len(src)) if pick(j)][:batches]:
            b = src.batch(0, j)
            lk = tr.lookups(b.sparse_features, b.labels.numel())
            a = all_hot_given_cold(torch.nonzero(lk.slots < 0).squeeze(1), lk.lengths, lk.rows)
            a = a.view(lk.inputs, lk.rows_per_input).all(1)
            hits, seen = hits + int(a.sum()), seen + a.numel()
        out[name] = round(hits / seen, 4) if seen else None
    return out


def _thread_timed(obj, name: str, acc: dict) -> None:
    """Wrap `obj.name` to add its thread CPU time to acc[name]."""
    fn = getattr(obj, name)
    acc[name] = 0.0

    def timed(*a, **k):
        t0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            acc[name] += time.thread_time() - t0

    setattr(obj, name, timed)


def step_interleaved(base: dict, args, steps: int, work: Path) -> dict:
    """Steps of the baseline and of Slipstream (past its warm-up, snapshots included) alternated
    one by one in one process, each timed by the thread CPU time it takes (one torch thread,
    one numba thread: the load of the shared machine does not enter): what a Slipstream step
    costs against a baseline step, and where Slipstream's own part of it goes."""
    import torch

    base = dict(base, data_size=base["data_size"] * 4)  # an endless stream: never runs out
    kw = variants(base, args, 0)
    trainers = {k: Trainer(TrainConfig(**kw[k], seed=0, out_dir=str(work / f"interleaved-{k}")),
                           checkpoints=False) for k in ("baseline", "slipstream")}  # fmt: skip
    its = {k: t.data.train.batches(0) for k, t in trainers.items()}
    for _ in range(args.warmup + 2 * args.interval):  # untimed: past the warm-up, sets chosen
        trainers["slipstream"].pipeline.progress(its["slipstream"])
    for _ in range(4):
        trainers["baseline"].pipeline.progress(its["baseline"])
    pipe = trainers["slipstream"].pipeline
    parts: dict[str, float] = {}
    _thread_timed(pipe.stream, "decide", parts)  # classifying source batches
    _thread_timed(pipe.stream, "_assemble", parts)  # cutting and joining refilled mini-batches
    _thread_timed(pipe, "_snapshot", parts)  # snapshots, drift, threshold
    _thread_timed(pipe.tracker, "count", parts)  # counting trained lookups (min lookups)
    _thread_timed(pipe.stream, "source_batch", parts)  # reading source batches (data)
    times: dict[str, list[float]] = {k: [] for k in trainers}
    samples = dict.fromkeys(trainers, 0)
    skipped0, source0 = pipe.counts["samples_skipped"], pipe.counts["samples_trained"]
    for _ in range(steps):
        for k, t in trainers.items():
            t0 = time.thread_time()
            out = t.pipeline.progress(its[k])
            torch.cuda.synchronize() if t.device.type == "cuda" else None
            times[k].append(time.thread_time() - t0)
            samples[k] += out.samples
    q = {k: statistics.quantiles(v, n=4) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    total = {k: sum(v) for k, v in times.items()}
    skipped = pipe.counts["samples_skipped"] - skipped0
    seen = pipe.counts["samples_trained"] - source0 + skipped
    own = {k: v for k, v in parts.items() if k != "source_batch"}
    return {
        "steps": steps, "clock": "thread CPU time (time.thread_time), torch and numba 1 thread",
        "ms_per_step_median": {k: round(1e3 * v, 2) for k, v in med.items()},
        "ms_per_step_quartiles": {k: [round(1e3 * q[k][0], 2), round(1e3 * q[k][2], 2)] for k in q},
        "ms_per_step_mean": {k: round(1e3 * v / steps, 2) for k, v in total.items()},
        "slipstream_step_cost_vs_baseline": round(med["slipstream"] / med["baseline"], 3),
        "slipstream_step_cost_vs_baseline_mean": round(total["slipstream"] / total["baseline"], 3),
        # Slipstream's own work per step (reading source batches is the data's, listed apart)
        "slipstream_parts_ms_per_step": {k: round(1e3 * v / steps, 3) for k, v in parts.items()},
        "slipstream_own_share_of_step": round(sum(own.values()) / total["slipstream"], 4),
        "source_inputs_per_trained_input": round(seen / max(1, samples["slipstream"]), 4),
        "samples": samples,
    }  # fmt: skip


def at_epoch(r: dict, epoch: int) -> dict:
    """The run as it stood at the end of `epoch` (its first evaluation in the next epoch's name)."""
    ends = [e for e in r["evals"] if e[3] == epoch]
    t, auc, step, _, wall = ends[0]
    return {
        "test_auc": auc,
        "cpu_s": t,
        "wall_s": wall,
        "steps": step,
        "evals": [e for e in r["evals"] if e[2] <= step],
    }


def skipped(r: dict) -> float:
    """A run's skipped input share (0 for a run without Slipstream)."""
    return r.get("slipstream", r).get("skipped_input_share") or 0.0


def time_to(r: dict, target: float) -> float | None:
    return next((t for t, auc, *_ in r["evals"] if auc >= target), None)


def spread(xs: list[float]) -> dict:
    return {
        "mean": round(statistics.fmean(xs), 5), "median": round(statistics.median(xs), 5),
        "min": round(min(xs), 5), "max": round(max(xs), 5),
        "std": round(statistics.stdev(xs), 5) if len(xs) > 1 else 0.0,
    }  # fmt: skip


# every variant a round may hold, in the order they are trained
VARIANTS = ("baseline", "slipstream", "random", "normalized", "baseline_normalized")


def compare(rounds: list[dict]) -> dict:
    """Per seed: {baseline, slipstream[, random][, normalized, baseline_normalized]} -> the
    figures the targets are judged on (and what normalisation changes)."""
    out: dict = {"per_seed": []}
    names = [k for k in VARIANTS if k in rounds[0]]
    for r in rounds:
        b, s = r["baseline"], r["slipstream"]
        target = b["test_auc"] - AUC_MARGIN
        clock = "cpu_s" if "cpu_s" in b else "wall_s"  # made-up runs in tests have wall only
        out["per_seed"].append({
            "auc": {k: round(r[k]["test_auc"], 5) for k in names},
            "time_s": {k: round(r[k][clock], 2) for k in names},
            "wall_s": {k: round(r[k]["wall_s"], 2) for k in names},
            "steps": {k: r[k]["steps"] for k in names},
            "time_ratio": round(b[clock] / s[clock], 3),
            "wall_ratio": round(b["wall_s"] / s["wall_s"], 3),
            "step_ratio": round(b["steps"] / s["steps"], 3),
            "time_to_baseline_auc_minus_0.001_s": {k: time_to(r[k], target) for k in names},
            "skipped_input_share": {k: skipped(r[k]) for k in names if k != "baseline"},
        })  # fmt: skip
    ps = out["per_seed"]

    def change(a: str, b: str = "baseline") -> list[float]:
        return [p["auc"][a] - p["auc"][b] for p in ps]

    out["time_ratio"] = spread([p["time_ratio"] for p in ps])
    out["wall_ratio"] = spread([p["wall_ratio"] for p in ps])
    out["step_ratio"] = spread([p["step_ratio"] for p in ps])
    out["auc_change_slipstream"] = spread(change("slipstream"))
    out["targets"] = {
        "time_1.2x_less": out["time_ratio"]["median"] >= 1.2,
        "auc_within_0.001": abs(out["auc_change_slipstream"]["mean"]) <= AUC_MARGIN
        or out["auc_change_slipstream"]["mean"] > 0,
    }  # fmt: skip
    if "random" in names:
        out["auc_change_random"] = spread(change("random"))
        out["slipstream_minus_random_auc"] = spread(change("slipstream", "random"))
        out["targets"]["random_loses_more_auc"] = out["slipstream_minus_random_auc"]["mean"] > 0
    if "normalized" in names:  # does normalisation win back what skipping lost?
        out["normalization"] = {
            # Slipstream with it, and without skipping, against the plain baseline
            "auc_change_normalized": spread(change("normalized")),
            "auc_change_baseline_normalized": spread(change("baseline_normalized")),
            # > 0: AUC won back against Slipstream without it
            "normalized_minus_slipstream_auc": spread(change("normalized", "slipstream")),
            # skipping's own loss with normalisation (against auc_change_slipstream without)
            "skip_loss_normalized": spread(change("normalized", "baseline_normalized")),
        }  # fmt: skip
    return out


def variants(base: dict, args, seed: int, share: float | None = None) -> dict[str, dict]:
    slip = dict(slipstream=True, slipstream_interval=args.interval, slipstream_warmup=args.warmup,
                slipstream_target_skip=args.target_skip,
                slipstream_min_lookups=args.min_lookups)  # fmt: skip
    out = {"baseline": base, "slipstream": {**base, **slip}}
    if share is not None:
        out["random"] = {
            **base,
            **slip,
            "slipstream_control": "random",
            "slipstream_target_skip": share,
        }
    if getattr(args, "normalize", 0):
        # every feature's pooled embedding a unit vector: with Slipstream's skipping, and
        # without it (threshold 0: nothing is ever stale, so nothing is skipped)
        out["normalized"] = {**base, **slip, "slipstream_normalize": True}
        out["baseline_normalized"] = {**out["normalized"], "slipstream_threshold": 0.0}
    return out


def one_round(base: dict, args, seed: int, work: Path, tag: str) -> dict:
    res = {}
    for name, kw in variants(base, args, seed).items():
        res[name] = run(TrainConfig(**kw, seed=seed, out_dir=str(work / f"{tag}-{name}-{seed}")))
        log(tag, seed, name, res[name])
    if not args.control:
        return res
    share = round(res["slipstream"]["skip_share_after_warmup"], 4)
    if share == 0:  # dropping nothing is the baseline, bit for bit (tested)
        res["random"] = dict(res["baseline"], note="Slipstream dropped nothing: the baseline")
        return res
    kw = variants(base, args, seed, share)["random"]
    res["random"] = run(TrainConfig(**kw, seed=seed, out_dir=str(work / f"{tag}-random-{seed}")))
    log(tag, seed, "random", res["random"])
    return res


def log(tag: str, seed: int, name: str, r: dict) -> None:
    s = r.get("slipstream", {})
    print(f"[{time.strftime('%H:%M:%S')}] {tag} seed {seed} {name}: auc {r['test_auc']:.5f} "
          f"wall {r['wall_s']:.1f}s steps {r['steps']} skipped {s.get('skipped_input_share', 0):.3f} "
          f"stale rows {s.get('stale_row_share', 0):.3f} (run {r['run_s']}s, load {load_average()})",
          file=sys.stderr, flush=True)  # fmt: skip


def plot(path: Path, histories: dict[str, list], curves: dict[str, list]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, h in histories.items():
        a.plot([x[0] for x in h], [x[2] for x in h], marker=".", label=name)
    a.set(
        xlabel="step", ylabel="stale share of tracked rows", title="Stale tracked rows (snapshots)"
    )
    a.legend()
    for name, pts in curves.items():
        pts = sorted(pts)
        b.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    b.axhline(-AUC_MARGIN, color="gray", ls="--", lw=0.8)
    b.set(
        xlabel="skipped input share", ylabel="test AUC - baseline", title="Skip share vs AUC change"
    )
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def walk_sizes(args: argparse.Namespace, prog: str) -> None:
    """HYBRID_DLRM_QUICK (hybrid_dlrm/common/quick.py): the docs' walk runs this at its sizes."""
    args.test_samples = 65_536  # the synthetic data's test set
    if quick.active():
        args.seeds = quick.cap("--seeds", args.seeds)
        args.hotline_seeds = quick.cap("--hotline-seeds", args.hotline_seeds, like="--seeds")
        args.batch = quick.cap("--batch", args.batch, like="--mini-batch-size")
        args.synthetic_samples = quick.cap(
            "--synthetic-samples", args.synthetic_samples, like="--train-samples"
        )
        args.test_samples = quick.cap(
            "its test samples", args.test_samples, like="--test-data-size"
        )
        args.criteo_lines = quick.cap("--criteo-lines", args.criteo_lines, like="--lines")
        args.criteo_epochs = quick.cap("--criteo-epochs", args.criteo_epochs, like="--nepochs")
        args.warmup = quick.cap("--warmup", args.warmup)
        args.interval = quick.cap("--interval", args.interval)
        args.evals_per_epoch = quick.cap("--evals-per-epoch", args.evals_per_epoch)
        curve = [x for x in args.curve.split(",") if x]
        args.curve = ",".join(curve[: quick.cap("--curve", len(curve))])
        args.interleave_steps = quick.cap("--interleave-steps", args.interleave_steps)
        quick.announce(prog)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--data", default="synthetic,criteo")
    p.add_argument("--synthetic-samples", type=int, default=2048 * 2048)
    p.add_argument("--criteo-lines", type=int, default=7 * 131_072)
    p.add_argument("--criteo-epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--lr", type=float, default=0.4,
                   help="SGD learning rate (0.4: the baseline plateaus within the runs)")  # fmt: skip
    p.add_argument("--hot-budget", default="16MB")
    p.add_argument("--profile-sample-rate", type=float, default=0.25)
    p.add_argument("--arch", default="small", choices=("small", "reference"),
                   help="small: MLPs 13-64-16 / 64-1 (as bench_placement); reference: Kaggle's")  # fmt: skip
    p.add_argument("--interval", type=int, default=50)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--target-skip", type=float, default=0.2)
    p.add_argument("--min-lookups", type=int, default=8,
                   help="trained lookups per interval before a row may be called stale")  # fmt: skip
    p.add_argument("--threads", type=int, default=1,
                   help="torch and numba threads (1: CPU time measures the work, not the load)")  # fmt: skip
    p.add_argument("--curve", default="0.05,0.2",
                   help="explicit drift thresholds for the skip share vs AUC curve (first seed)")  # fmt: skip
    p.add_argument("--curve-data", default="synthetic", help="data sets the curve is run on")
    p.add_argument("--evals-per-epoch", type=int, default=8)
    p.add_argument("--hotline-seeds", type=int, default=1)
    p.add_argument("--interleave-steps", type=int, default=100,
                   help="steps of baseline and Slipstream alternated in one process (synthetic)")  # fmt: skip
    p.add_argument("--interleave-archs", default="small,reference",
                   help="the MLPs the interleaved step cost is measured with")  # fmt: skip
    p.add_argument("--normalize", type=int, default=0,
                   help="1: every round also trains Slipstream with --slipstream-normalize, and "
                   "with it but nothing skipped")  # fmt: skip
    p.add_argument("--control", type=int, default=1,
                   help="0: no random control (rounds that answer another question)")  # fmt: skip
    p.add_argument("--work", default="", help="scratch directory (default: a new one in /tmp)")
    p.add_argument("--out", default="", help="write bench_slipstream.json and .png here")
    p.add_argument("--overwrite", action="store_true", help="replace those files in --out")
    args = p.parse_args()
    walk_sizes(args, p.prog)
    if args.out:
        check_bench_out(Path(args.out), ["bench_slipstream.json", "bench_slipstream.png"],
                        args.overwrite, p.prog)  # fmt: skip
    import numba
    import torch

    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_slipstream_"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    common = dict(mini_batch_size=args.batch, device="cpu", placement="device",
                  hot_budget=args.hot_budget, profile_sample_rate=args.profile_sample_rate,
                  learning_rate=args.lr, print_freq=10**9, progress=False)  # fmt: skip
    if args.arch == "small":
        common.update(arch_sparse_feature_size=16, arch_mlp_bot=(13, 64, 16), arch_mlp_top=(64, 1))
    data = {}
    names = args.data.split(",")
    if "synthetic" in names:
        steps = args.synthetic_samples // args.batch
        data["synthetic"] = dict(common, data_set="synthetic", data_size=args.synthetic_samples,
                                 test_data_size=args.test_samples, test_freq=max(1, steps // args.evals_per_epoch))  # fmt: skip
    if "criteo" in names:
        t0 = time.perf_counter()
        processed = criteo_data(work, args.criteo_lines)
        from dlrm.data import build_data

        probe = dict(common, data_set="kaggle", processed_data_file=str(processed))
        steps = len(build_data(TrainConfig(**probe, out_dir=str(work / "probe"))).train)
        data["criteo"] = dict(common, data_set="kaggle", processed_data_file=str(processed),
                              nepochs=args.criteo_epochs, test_freq=max(1, steps // args.evals_per_epoch))  # fmt: skip
        print(f"criteo data: {time.perf_counter() - t0:.1f}s, {processed}", file=sys.stderr)
    result: dict = {
        "machine": {"cpu_flags": cpu_flags(), "cpus": os.cpu_count(), "load_start": load_average()},
        "settings": vars(args), "data": {},
    }  # fmt: skip
    histories, curves = {}, {}
    if data:  # untimed: kernels compiled or loaded, caches warm, before the first timed run
        first = next(iter(data.values()))
        warm = {**variants(first, args, 0)["slipstream"], "nepochs": 1, "slipstream_warmup": 2,
                "slipstream_interval": 2, "slipstream_min_lookups": 1, "test_freq": 0,
                "data_size": 8 * args.batch, "data_set": "synthetic"}  # fmt: skip
        warm.pop("processed_data_file", None)
        run(TrainConfig(**warm, seed=0, out_dir=str(work / "warm-up")))
    rounds: dict[str, list] = {k: [] for k in data}
    for seed in range(args.seeds):  # rounds: every data set and variant once per seed
        for name, base in data.items():
            rounds[name].append(one_round(base, args, seed, work, name))
    for name, rs in rounds.items():
        if not rs:
            continue
        d = {"compare": compare(rs), "runs": rs,
             "all_tracked_input_share": rs[0]["slipstream"]["all_tracked_input_share"]}  # fmt: skip
        if name == "criteo":
            firsts = [{k: at_epoch(r[k], 1) for k in VARIANTS if k in r} for r in rs]
            for f, r in zip(firsts, rs):
                for k in f:
                    f[k]["skipped_input_share"] = skipped(r[k])
            d["compare_1_epoch"] = compare(firsts)
        histories[f"{name}, target skip {args.target_skip}"] = rs[0]["slipstream"]["history"]
        b0 = rs[0]["baseline"]["test_auc"]
        curves[f"{name}, fixed thresholds"] = []
        curves[f"{name}, target skip"] = [(skipped(rs[0]["slipstream"]),
                         rs[0]["slipstream"]["test_auc"] - b0)]  # fmt: skip
        for k in ("random", "normalized"):
            if k in rs[0]:
                curves[f"{name} {k}"] = [(skipped(rs[0][k]), rs[0][k]["test_auc"] - b0)]
        for t in [float(x) for x in args.curve.split(",") if x and name in args.curve_data]:
            kw = {**variants(data[name], args, 0)["slipstream"], "slipstream_threshold": t}
            r = run(TrainConfig(**kw, seed=0, out_dir=str(work / f"{name}-curve-{t}")))
            log(name, 0, f"threshold {t}", r)
            share = r["slipstream"]["skipped_input_share"]
            curves[f"{name}, fixed thresholds"].append((share, r["test_auc"] - b0))
            histories[f"{name}, threshold {t}"] = r["history"]
            d.setdefault("curve", []).append({
                "threshold": t, "skipped_input_share": round(share, 4),
                "auc_change": round(r["test_auc"] - b0, 5), "wall_s": r["wall_s"], "steps": r["steps"],
                "stale_row_share_by_snapshot": [round(h[2], 4) for h in r["history"]]})  # fmt: skip
        if not curves[f"{name}, fixed thresholds"]:  # no curve run: no empty line in the plot
            del curves[f"{name}, fixed thresholds"]
        result["data"][name] = d
    if args.interleave_steps and "synthetic" in data:
        result["step_interleaved"] = {}
        for arch in [a for a in args.interleave_archs.split(",") if a]:
            base = dict(data["synthetic"])
            if arch == "reference":  # the Kaggle reference's MLPs (TrainConfig's defaults)
                for k in ("arch_sparse_feature_size", "arch_mlp_bot", "arch_mlp_top"):
                    base.pop(k, None)
            r = step_interleaved(base, args, args.interleave_steps, work / arch)
            result["step_interleaved"][arch] = r
            print(f"step interleaved ({arch}): {r}", file=sys.stderr, flush=True)
    if args.hotline_seeds and "synthetic" in data:
        hl = []
        base = dict(data["synthetic"], placement="hotline")
        for seed in range(args.hotline_seeds):
            hl.append(one_round(base, args, seed, work, "hotline"))
        result["data"]["synthetic_hotline"] = {"compare": compare(hl), "runs": hl}
        histories["synthetic over hotline"] = hl[0]["slipstream"]["history"]
    result["machine"]["load_end"] = load_average()
    result["bench_s"] = round(time.perf_counter() - t_start, 1)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_slipstream.json").write_text(text + "\n")
        plot(out / "bench_slipstream.png", histories, curves)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
