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
and Slipstream on top of Hotline (`--hotline-seeds`, synthetic data).

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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_placement, when imported

from bench_placement import _load, cpu_flags  # noqa: E402

from dlrm import TrainConfig, Trainer  # noqa: E402

AUC_MARGIN = 0.001


def criteo_data(work: Path, lines: int) -> Path:
    """A planted Kaggle-layout raw file, preprocessed with the Kaggle recipe (reused if there)."""
    from data_pipeline.preprocess import ensure_preprocessed
    from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle

    raw = work / "raw" / "train.txt"
    if not raw.is_file():
        write_kaggle(raw.parent, lines, 0, SyntheticSpec(seed=7))
    return ensure_preprocessed("kaggle", raw, work / "kaggle.processed", seed=0)


def run(cfg: TrainConfig) -> dict:
    t0 = time.perf_counter()
    trainer = Trainer(cfg, checkpoints=False)
    summary = trainer.fit()
    events = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(e["train_time_s"], e["test_auc"], e["step"], e["epoch"]) for e in events if e["event"] == "eval"]  # fmt: skip
    out = {
        "test_auc": summary["test_auc"], "wall_s": round(summary["wall_s"], 3),
        "steps": summary["steps"], "samples": summary["samples"], "evals": evals,
        "run_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    s = summary.get("slipstream")
    if s:
        out["slipstream"] = s
        out["history"] = trainer.pipeline.history  # [step, threshold, stale share, median drift]
        pre = cfg.slipstream_warmup * cfg.mini_batch_size
        seen = s["samples_trained"] + s["samples_skipped"]
        out["skip_share_after_warmup"] = s["samples_skipped"] / max(1, seen - pre)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    return out


def step_interleaved(base: dict, args, steps: int, work: Path) -> dict:
    """Steps of the baseline and of Slipstream (past its warm-up, snapshots included) alternated
    one by one in one process: what a Slipstream step costs against a baseline step, measured
    under the same load (a whole run's time swings with the machine's)."""
    import torch

    base = dict(base, data_size=base["data_size"] * 4)  # an endless stream: never runs out
    kw = variants(base, args, 0)
    trainers = {k: Trainer(TrainConfig(**kw[k], seed=0, out_dir=str(work / f"interleaved-{k}")),
                           checkpoints=False) for k in ("baseline", "slipstream")}  # fmt: skip
    its = {k: t.data.train.batches(0) for k, t in trainers.items()}
    for _ in range(args.warmup + 2 * args.interval):  # untimed: past the warm-up, sets chosen
        trainers["slipstream"].pipeline.progress(its["slipstream"])
    times: dict[str, list[float]] = {k: [] for k in trainers}
    samples = dict.fromkeys(trainers, 0)
    for _ in range(steps):
        for k, t in trainers.items():
            t0 = time.perf_counter()
            out = t.pipeline.progress(its[k])
            torch.cuda.synchronize() if t.device.type == "cuda" else None
            times[k].append(time.perf_counter() - t0)
            samples[k] += out.samples
    q = {k: statistics.quantiles(v, n=4) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "steps": steps, "ms_per_step_median": {k: round(1e3 * v, 2) for k, v in med.items()},
        "ms_per_step_quartiles": {k: [round(1e3 * q[k][0], 2), round(1e3 * q[k][2], 2)] for k in q},
        "slipstream_step_cost_vs_baseline": round(med["slipstream"] / med["baseline"], 3),
        "samples": samples,
    }  # fmt: skip


def at_epoch(r: dict, epoch: int) -> dict:
    """The run as it stood at the end of `epoch` (its first evaluation in the next epoch's name)."""
    ends = [e for e in r["evals"] if e[3] == epoch]
    t, auc, step, _ = ends[0]
    return {
        "test_auc": auc,
        "wall_s": t,
        "steps": step,
        "evals": [e for e in r["evals"] if e[2] <= step],
    }


def time_to(r: dict, target: float) -> float | None:
    return next((t for t, auc, _, _ in r["evals"] if auc >= target), None)


def spread(xs: list[float]) -> dict:
    return {
        "mean": round(statistics.fmean(xs), 5), "median": round(statistics.median(xs), 5),
        "min": round(min(xs), 5), "max": round(max(xs), 5),
        "std": round(statistics.stdev(xs), 5) if len(xs) > 1 else 0.0,
    }  # fmt: skip


def compare(rounds: list[dict]) -> dict:
    """Per seed: {baseline, slipstream, random} -> the figures the targets are judged on."""
    out: dict = {"per_seed": []}
    for r in rounds:
        b, s = r["baseline"], r["slipstream"]
        target = b["test_auc"] - AUC_MARGIN
        out["per_seed"].append({
            "auc": {k: round(r[k]["test_auc"], 5) for k in ("baseline", "slipstream", "random")},
            "wall_s": {k: round(r[k]["wall_s"], 2) for k in ("baseline", "slipstream", "random")},
            "steps": {k: r[k]["steps"] for k in ("baseline", "slipstream", "random")},
            "time_ratio": round(b["wall_s"] / s["wall_s"], 3),
            "step_ratio": round(b["steps"] / s["steps"], 3),
            "time_to_baseline_auc_minus_0.001_s": {
                k: time_to(r[k], target) for k in ("baseline", "slipstream", "random")},
            "skipped_input_share": {k: r[k].get("slipstream", r[k]).get("skipped_input_share")
                                    for k in ("slipstream", "random")},
        })  # fmt: skip
    ps = out["per_seed"]
    d_slip = [p["auc"]["slipstream"] - p["auc"]["baseline"] for p in ps]
    d_rand = [p["auc"]["random"] - p["auc"]["baseline"] for p in ps]
    out["time_ratio"] = spread([p["time_ratio"] for p in ps])
    out["step_ratio"] = spread([p["step_ratio"] for p in ps])
    out["auc_change_slipstream"] = spread(d_slip)
    out["auc_change_random"] = spread(d_rand)
    out["slipstream_minus_random_auc"] = spread([a - b for a, b in zip(d_slip, d_rand)])
    out["targets"] = {
        "time_1.2x_less": out["time_ratio"]["median"] >= 1.2,
        "auc_within_0.001": abs(out["auc_change_slipstream"]["mean"]) <= AUC_MARGIN
        or out["auc_change_slipstream"]["mean"] > 0,
        "random_loses_more_auc": out["slipstream_minus_random_auc"]["mean"] > 0,
    }  # fmt: skip
    return out


def variants(base: dict, args, seed: int, share: float | None = None) -> dict[str, dict]:
    slip = dict(slipstream=True, slipstream_interval=args.interval, slipstream_warmup=args.warmup,
                slipstream_target_skip=args.target_skip)  # fmt: skip
    out = {"baseline": base, "slipstream": {**base, **slip}}
    if share is not None:
        out["random"] = {
            **base,
            **slip,
            "slipstream_control": "random",
            "slipstream_target_skip": share,
        }
    return out


def one_round(base: dict, args, seed: int, work: Path, tag: str) -> dict:
    res = {}
    for name, kw in variants(base, args, seed).items():
        res[name] = run(TrainConfig(**kw, seed=seed, out_dir=str(work / f"{tag}-{name}-{seed}")))
        log(tag, seed, name, res[name])
    share = round(res["slipstream"]["skip_share_after_warmup"], 4)
    kw = variants(base, args, seed, share)["random"]
    res["random"] = run(TrainConfig(**kw, seed=seed, out_dir=str(work / f"{tag}-random-{seed}")))
    log(tag, seed, "random", res["random"])
    return res


def log(tag: str, seed: int, name: str, r: dict) -> None:
    s = r.get("slipstream", {})
    print(f"[{time.strftime('%H:%M:%S')}] {tag} seed {seed} {name}: auc {r['test_auc']:.5f} "
          f"wall {r['wall_s']:.1f}s steps {r['steps']} skipped {s.get('skipped_input_share', 0):.3f} "
          f"stale rows {s.get('stale_row_share', 0):.3f} (run {r['run_s']}s, load {_load()})",
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--data", default="synthetic,criteo")
    p.add_argument("--synthetic-samples", type=int, default=262_144)
    p.add_argument("--criteo-lines", type=int, default=7 * 16_384)
    p.add_argument("--criteo-epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--hot-budget", default="16MB")
    p.add_argument("--profile-sample-rate", type=float, default=0.25)
    p.add_argument("--arch", default="small", choices=("small", "reference"),
                   help="small: MLPs 13-64-16 / 64-1 (as bench_placement); reference: Kaggle's")  # fmt: skip
    p.add_argument("--interval", type=int, default=16)
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--target-skip", type=float, default=0.2)
    p.add_argument("--curve", default="0.01,0.03,0.1",
                   help="explicit drift thresholds for the skip share vs AUC curve (first seed)")  # fmt: skip
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--hotline-seeds", type=int, default=1)
    p.add_argument("--interleave-steps", type=int, default=40,
                   help="steps of baseline and Slipstream alternated in one process (synthetic)")  # fmt: skip
    p.add_argument("--normalize", type=int, default=1, help="also Slipstream with normalization")
    p.add_argument("--work", default="", help="scratch directory (default: a new one in /tmp)")
    p.add_argument("--out", default="", help="write bench_slipstream.json and .png here")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_slipstream_"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    common = dict(mini_batch_size=args.batch, device="cpu", placement="device",
                  hot_budget=args.hot_budget, profile_sample_rate=args.profile_sample_rate,
                  print_freq=10**9, progress=False)  # fmt: skip
    if args.arch == "small":
        common.update(arch_sparse_feature_size=16, arch_mlp_bot=(13, 64, 16), arch_mlp_top=(64, 1))
    data = {}
    names = args.data.split(",")
    if "synthetic" in names:
        steps = args.synthetic_samples // args.batch
        data["synthetic"] = dict(common, data_set="synthetic", data_size=args.synthetic_samples,
                                 test_data_size=65_536, test_freq=max(1, steps // args.evals_per_epoch))  # fmt: skip
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
        "machine": {"cpu_flags": cpu_flags(), "cpus": os.cpu_count(), "load_start": _load()},
        "settings": vars(args), "data": {},
    }  # fmt: skip
    histories, curves = {}, {}
    rounds: dict[str, list] = {k: [] for k in data}
    for seed in range(args.seeds):  # rounds: every data set and variant once per seed
        for name, base in data.items():
            rounds[name].append(one_round(base, args, seed, work, name))
    for name, rs in rounds.items():
        if not rs:
            continue
        d = {"compare": compare(rs), "runs": rs}
        if name == "criteo":
            firsts = [
                {k: at_epoch(r[k], 1) for k in ("baseline", "slipstream", "random")} for r in rs
            ]
            for f, r in zip(firsts, rs):
                for k in ("slipstream", "random"):
                    f[k]["skipped_input_share"] = r[k]["slipstream"]["skipped_input_share"]
            d["compare_1_epoch"] = compare(firsts)
        histories[f"{name}, target skip {args.target_skip}"] = rs[0]["slipstream"]["history"]
        b0 = rs[0]["baseline"]["test_auc"]
        curves[f"{name}, fixed thresholds"] = []
        curves[f"{name}, target skip"] = [(rs[0]["slipstream"]["slipstream"]["skipped_input_share"],
                         rs[0]["slipstream"]["test_auc"] - b0)]  # fmt: skip
        curves[f"{name} random"] = [(rs[0]["random"]["slipstream"]["skipped_input_share"],
                                     rs[0]["random"]["test_auc"] - b0)]  # fmt: skip
        for t in [float(x) for x in args.curve.split(",") if x]:
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
        if args.normalize:
            kw = {**variants(data[name], args, 0)["slipstream"], "slipstream_normalize": True}
            r = run(TrainConfig(**kw, seed=0, out_dir=str(work / f"{name}-normalized")))
            log(name, 0, "normalized", r)
            d["normalized"] = {"test_auc": r["test_auc"], "auc_change": round(r["test_auc"] - b0, 5),
                               "vs_slipstream": round(r["test_auc"] - rs[0]["slipstream"]["test_auc"], 5)}  # fmt: skip
        result["data"][name] = d
    if args.interleave_steps and "synthetic" in data:
        result["step_interleaved"] = step_interleaved(
            data["synthetic"], args, args.interleave_steps, work
        )
        print(f"step interleaved: {result['step_interleaved']}", file=sys.stderr, flush=True)
    if args.hotline_seeds and "synthetic" in data:
        hl = []
        base = dict(data["synthetic"], placement="hotline")
        for seed in range(args.hotline_seeds):
            hl.append(one_round(base, args, seed, work, "hotline"))
        result["data"]["synthetic_hotline"] = {"compare": compare(hl), "runs": hl}
        histories["synthetic over hotline"] = hl[0]["slipstream"]["history"]
    result["machine"]["load_end"] = _load()
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
