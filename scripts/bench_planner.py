"""The placement planner's proof: every candidate predicted AND measured, over configurations that
span table scale, --memory-limit and batch size; prints one JSON object.

    python scripts/bench_planner.py                 # 8 configurations, ~15 min on 2 cores
    python scripts/bench_planner.py --quick         # 2 tiny ones: a smoke test (seconds to a minute)

Per configuration: the planning sample (an access profile counted on epoch 1, and evenly spread
epoch-0 batches: the ones training sees, out of the profile's sample), the prediction of each
candidate by the registered predictor (perfmodel/placement_costs.py) and whether it fits
(dlrm/memory.py's check at the configuration's --memory-limit); then each candidate trained in
this process on its own Trainer, interleaved: `--rounds` rounds, each running `--steps` steps of
every candidate in turn (one torch thread), the first `--warmup` steps of each trainer not
counted. Measured = the median over the counted steps of the step thread's CPU time plus the
time it waited for a staging (the collection's `exposed_gather_s`): on a shared machine wall
time holds the neighbours' time slices (reported beside it, with the error against it). The
tiered candidates' tier files are filled first (`ScmTier.fill`), as a long run's are, so every
cache miss is a real read (the prediction assumes that steady state).

Reported: predicted vs measured per candidate, the chosen candidate (fastest predicted that fits:
the planner's rule), the measured fastest that fits, whether the chosen one is within 10% of it,
the median prediction error for device/host/FAE and for Hotline/tiered, planning time (profile
and sample included), every pair the prediction ranked against the measurement (with both
candidates' errors), CPU model and flags, load average.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.machine import cpu_model  # noqa: E402
from data_pipeline.synthetic import scaled_table_sizes  # noqa: E402
from dlrm import TrainConfig  # noqa: E402
from dlrm.data import build_data  # noqa: E402
from dlrm.errors import ConfigError  # noqa: E402
from dlrm.memory import check_memory  # noqa: E402
from dlrm.plan_setup import profiled_batches  # noqa: E402
from dlrm.planning import Candidate, predictor  # noqa: E402
from embeddings.config import SparseOptimizer  # noqa: E402
from embeddings.placement import row_bytes  # noqa: E402
from embeddings.profile import AccessProfiler  # noqa: E402
from scripts._shared import cpu_flags, load_average  # noqa: E402

# (name, Kaggle table scale, batch, room): `room` is what --memory-limit leaves this process beyond
# what it holds when the configuration is planned (--memory-limit counts the process's resident
# memory, which grows over the benchmark): sized to rule out the in-memory placements
CONFIGS = [
    ("s0.01-b256", 0.01, 256, None),
    ("s0.01-b1024", 0.01, 1024, None),
    ("s0.03-b512", 0.03, 512, None),
    ("s0.03-b2048", 0.03, 2048, None),
    ("s0.1-b512", 0.1, 512, None),
    ("s0.1-b1024-room180MB", 0.1, 1024, 180 << 20),
    ("s0.2-b1024", 0.2, 1024, None),
    ("s0.2-b2048-room330MB", 0.2, 2048, 330 << 20),
]
QUICK = [("q-s0.002-b128", 0.002, 128, None), ("q-s0.004-b256-room40MB", 0.004, 256, 40 << 20)]


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


GROUPS = {"device": "device_fae", "host": "device_fae", "fae": "device_fae",
          "hotline": "staged", "tiered": "staged"}  # fmt: skip
TARGETS = {"device_fae": 0.10, "staged": 0.15}


def base_config(scale: float, batch: int, limit: int | None, args, out: Path) -> TrainConfig:
    return TrainConfig(
        arch_embedding_size=tuple(scaled_table_sizes(scale)), arch_sparse_feature_size=args.dim,
        arch_mlp_bot=args.mlp_bot, arch_mlp_top=args.mlp_top, synthetic_zipf=args.zipf,
        data_size=batch * args.batches, test_data_size=batch * 4, mini_batch_size=batch,
        optimizer="sgd", learning_rate=0.1, device="cpu", seed=7, memory_limit=limit,
        print_freq=10**6, progress=False, out_dir=str(out),
    )  # fmt: skip


def candidates(cfg: TrainConfig, sizes: list[int], quick: bool) -> list[Candidate]:
    """device, host, FAE at one budget, Hotline at two, tiered at one budget and two caches:
    budgets as shares of the tables' bytes (weights + optimizer state)."""
    total = sum(sizes) * row_bytes(cfg.arch_sparse_feature_size, SparseOptimizer(cfg.optimizer))
    small, large = int(total * 0.05), int(total * 0.25)
    out = [Candidate("device"), Candidate("host"), Candidate("fae", large),
           Candidate("hotline", small), Candidate("hotline", large),
           Candidate("tiered", small, int(total * 0.02)), Candidate("tiered", small, int(total * 0.3))]  # fmt: skip
    return out[:1] + out[2:4] + out[5:6] if quick else out


def with_candidate(cfg: TrainConfig, c: Candidate, out: Path, profile: Path) -> TrainConfig:
    name = c.label().replace(", ", "-").replace(" ", "")
    fields = dict(c.settings(), out_dir=str(out / name))
    if c.placement != "device" and c.placement != "host":
        fields["profile_file"] = str(profile)
    return TrainConfig.from_json({**cfg.to_json(), **fields})


def planning_sample(cfg: TrainConfig, n_batches: int, profile_path: Path, profile_inputs: int):
    """The profile (epoch-1 inputs, written for the runs to reuse) and epoch-0 batches."""
    data = build_data(cfg)
    train = data.train
    prof = AccessProfiler(data.table_sizes, data.feature_names)
    seen, epoch = 0, 1
    while seen < profile_inputs:
        for b in train.batches(epoch):
            prof.add_kjt(b.sparse_features)
            seen += b.labels.numel()
            if seen >= profile_inputs:
                break
        epoch += 1
    profile = prof.finish()
    profile.save(profile_path)
    idx = profiled_batches(len(train), n_batches / len(train))
    return SimpleNamespace(
        profile=profile, batches=[train.batch(0, j).sparse_features for j in idx]
    )


def fits(cfg: TrainConfig) -> tuple[bool, str | None]:
    try:
        check_memory(cfg, build_data(cfg), torch.device("cpu"))
        return True, None
    except ConfigError as e:
        return False, str(e)


try:  # the planner's order of preference breaks ties between equal predictions
    from dlrm.planner import PREFERENCE
except ImportError:  # before p-plan's planner is on this branch: its value there
    PREFERENCE = ("device", "fae", "hotline", "tiered", "host")


def choose(rows: dict) -> str | None:
    """The planner's rule: the fastest predicted candidate that fits, ties by its preference
    (kind, then the larger hot budget, then the larger cache). REPLACE with dlrm.planner's
    decision (which also keeps a 30% margin on memory) once this branch has the planner."""
    ok = [((r["predicted_ms"], PREFERENCE.index(r["placement"]), -r.get("hot_budget", 0),
            -r.get("scm_cache", 0)), n) for n, r in rows.items() if r["fits"]]  # fmt: skip
    return min(ok)[1] if ok else None


def _exposed(trainer) -> float:
    """Seconds the step thread has waited for stagings so far (0 without staging)."""
    coll = trainer.model.embeddings
    return float(coll.counters().get("exposed_gather_s", 0.0)) if hasattr(coll, "store") else 0.0


def measure(cfgs: dict[str, TrainConfig], args) -> dict[str, dict]:
    trainers, streams, wall, cpu, done = {}, {}, {}, {}, {}
    from dlrm.trainer import Trainer

    for name, cfg in cfgs.items():
        trainers[name] = Trainer(cfg, checkpoints=False)
        coll = trainers[name].model.embeddings
        tier = getattr(getattr(coll, "store", None), "tier", None)
        if tier is not None and hasattr(tier, "fill"):
            tier.fill()
        streams[name] = trainers[name].data.train.batches(0, 0)
        wall[name], cpu[name], done[name] = [], [], 0
    waited = {name: [] for name in trainers}
    for _ in range(args.rounds):
        for name, tr in trainers.items():
            for _ in range(args.steps):
                e0 = _exposed(tr)
                w0, c0 = time.perf_counter(), time.thread_time()
                tr.pipeline.progress(streams[name])
                if done[name] >= args.warmup:
                    wall[name].append(time.perf_counter() - w0)
                    cpu[name].append(time.thread_time() - c0)
                    waited[name].append(_exposed(tr) - e0)
                done[name] += 1
    out = {}
    for name, tr in trainers.items():
        counters = (
            tr.model.embeddings.counters() if hasattr(tr.model.embeddings, "counters") else {}
        )
        keep = ("cold_rows_per_batch", "hidden_share", "scm_cache_hit_rate", "scm_bytes_read",
                "scm_rows_read", "popular_input_share")  # fmt: skip
        # the step thread's CPU time plus what it waited for stagings: on a shared machine wall
        # time holds the neighbours' time slices; thread CPU time is what the model predicts
        step = [c + w for c, w in zip(cpu[name], waited[name])]
        out[name] = {
            "measured_ms": round(statistics.median(step) * 1e3, 3),
            "measured_wall_ms": round(statistics.median(wall[name]) * 1e3, 3),
            "measured_cpu_ms": round(statistics.median(cpu[name]) * 1e3, 3),
            "exposed_wait_ms": round(statistics.mean(waited[name]) * 1e3, 3),
            "steps_counted": len(wall[name]),
            **{k: counters[k] for k in keep if k in counters},
        }
    del trainers, streams
    gc.collect()
    return out


def wrong_pairs(rows: dict) -> list[dict]:
    """Pairs the prediction ordered against the measurement, each with both errors: the one with
    the larger error is what misled the ranking."""
    names = [n for n in rows if rows[n].get("measured_ms")]
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pa, pb = rows[a]["predicted_ms"], rows[b]["predicted_ms"]
            ma, mb = rows[a]["measured_ms"], rows[b]["measured_ms"]
            if (pa - pb) * (ma - mb) < 0:
                worse = a if abs(rows[a]["error"]) >= abs(rows[b]["error"]) else b
                out.append({"pair": [a, b], "predicted_ms": [pa, pb], "measured_ms": [ma, mb],
                            "measured_gap": round(abs(ma - mb) / min(ma, mb), 3),
                            "larger_error": worse, "errors": [rows[a]["error"], rows[b]["error"]],
                            "its_parts": rows[worse]["parts"]})  # fmt: skip
    return out


def run_config(spec, args, root: Path) -> dict:
    name, scale, batch, room = spec
    limit = None if room is None else resident_bytes() + room
    out = root / name
    cfg = base_config(scale, batch, limit, args, out)
    sizes = list(cfg.arch_embedding_size)
    profile = out / "profile.npz"
    out.mkdir(parents=True, exist_ok=True)
    predict = predictor()
    t0 = time.perf_counter()
    sample = planning_sample(cfg, args.sample_batches, profile, args.profile_batches * batch)
    sample_s = time.perf_counter() - t0
    rows, cfgs = {}, {}
    for c in candidates(cfg, sizes, args.quick):
        ccfg = with_candidate(cfg, c, out, profile)
        p0 = time.perf_counter()
        pred = predict(ccfg, c, sample)
        if room is not None:  # --memory-limit counts what the process holds now
            ccfg = TrainConfig.from_json(
                {**ccfg.to_json(), "memory_limit": resident_bytes() + room}
            )
        ok, why = fits(ccfg)
        rows[c.label()] = {
            "placement": c.placement, "hot_budget": c.hot_budget, "scm_cache": c.scm_cache,
            "predicted_ms": round(pred.ms_per_step, 3),
            "parts": {k: round(v, 3) for k, v in pred.parts.items()},
            "detail": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in pred.detail.items()},
            "fits": ok, "rejected": why, "predict_s": round(time.perf_counter() - p0, 3),
        }  # fmt: skip
        # measured on this machine whether or not it fits the limit (the limit decides the choice)
        cfgs[c.label()] = TrainConfig.from_json({**ccfg.to_json(), "memory_limit": None})
    planning_s = time.perf_counter() - t0
    measured = measure(cfgs, args)
    for n, r in rows.items():
        r.update(measured[n])
        r["error"] = round((r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"], 4)
        r["error_vs_wall"] = round(
            (r["predicted_ms"] - r["measured_wall_ms"]) / r["measured_wall_ms"], 4
        )
    chosen = choose(rows)
    fitting = {n: r for n, r in rows.items() if r["fits"]}
    fastest = min(fitting, key=lambda n: fitting[n]["measured_ms"]) if fitting else None
    within = None
    if chosen and fastest:
        within = rows[chosen]["measured_ms"] <= 1.10 * rows[fastest]["measured_ms"]
    return {
        "table_scale": scale, "rows": sum(sizes), "batch": batch, "memory_limit": limit, "room": room,
        "candidates": rows, "chosen": chosen, "measured_fastest_that_fits": fastest,
        "measured_fastest": min(rows, key=lambda n: rows[n]["measured_ms"]),
        "chosen_within_10pct": within, "planning_s": round(planning_s, 2),
        "sample_s": round(sample_s, 2), "wrong_rankings": wrong_pairs(rows), "load": load_average(),
    }  # fmt: skip


def summarise(configs: dict) -> dict:
    errs: dict[str, list[float]] = {g: [] for g in TARGETS}
    for c in configs.values():
        for r in c["candidates"].values():
            errs[GROUPS[r["placement"]]].append(abs(r["error"]))
    out = {}
    for g, e in errs.items():
        med = statistics.median(e) if e else None
        out[g] = {"median_abs_error": None if med is None else round(med, 4), "n": len(e),
                  "target": TARGETS[g], "met": None if med is None else med <= TARGETS[g]}  # fmt: skip
    within = [c["chosen_within_10pct"] for c in configs.values()]
    out["chosen_within_10pct"] = f"{sum(bool(w) for w in within)}/{len(within)}"
    out["wrong_rankings"] = sum(len(c["wrong_rankings"]) for c in configs.values())
    out["planning_s_max"] = max(c["planning_s"] for c in configs.values())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two tiny configurations (smoke test)")
    p.add_argument("--only", help="comma-separated configuration names")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=15, help="steps of each candidate per round")
    p.add_argument("--warmup", type=int, default=10, help="first steps of each trainer not counted")
    p.add_argument("--batches", type=int, default=400, help="training batches per epoch")
    p.add_argument("--profile-batches", type=int, default=100, help="batches the profile counts")
    p.add_argument("--sample-batches", type=int, default=16, help="batches the replay uses")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--mlp-bot", default="13-64-16")
    p.add_argument("--mlp-top", default="64-1")
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--out-dir", help="a new directory for the runs")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup = (
            min(args.rounds, 2),
            min(args.steps, 4),
            min(args.warmup, 2),
        )
        args.batches, args.profile_batches, args.sample_batches = 40, 10, 4
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    import perfmodel.recorder  # noqa: F401  (registers the predictor, as load_plugins would)
    from dlrm.step_hooks import load_plugins

    load_plugins()
    specs = QUICK if args.quick else CONFIGS
    if args.only:
        want = set(args.only.split(","))
        specs = [s for s in specs if s[0] in want]
        if not specs:
            p.error(f"--only: none of {sorted(want)} is a configuration")
    root = Path(args.out_dir or f"runs/bench_planner-{time.strftime('%Y%m%d-%H%M%S')}")
    if root.exists() and any(root.iterdir()):
        sys.stderr.write(f"{p.prog}: error: --out-dir {root}: not empty; choose a new one\n")
        return 2
    t0 = time.perf_counter()
    configs = {}
    for s in specs:  # each configuration's result also on its own line, as it completes
        configs[s[0]] = run_config(s, args, root)
        with open(root / "configs.jsonl", "a") as f:
            f.write(json.dumps({s[0]: configs[s[0]]}) + "\n")
    result = {
        "bench": "planner", "quick": args.quick, "configs": configs, "summary": summarise(configs),
        "settings": {k: v for k, v in vars(args).items() if k != "out_dir"},
        "cpu_model": cpu_model(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(),
        "load": load_average(), "wall_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
