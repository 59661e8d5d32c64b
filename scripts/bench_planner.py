"""The placement planner's proof: every candidate predicted AND measured, over configurations that
span table scale, --memory-limit and batch size; prints one JSON object.

    python scripts/bench_planner.py                 # 8 configurations, 5-8 min, one thread
    python scripts/bench_planner.py --quick         # 2 tiny ones: a smoke test (seconds to a minute)

Per configuration: `--placement auto`'s own decision (dlrm/placement/auto.py's `plan` on the CPU, timed:
the inventory, the access profile of `--profile-batches` of the epoch-0 batches, the planning
sample out of the batches the profile did not count, a prediction of every candidate that fits
with the planner's 30% margin), then the bench's fixed candidates and auto's choice (added where
it is not one of them), each predicted by its kind from the performance model's step costs (perfmodel/placement_costs.py)
on the planner's sample, with whether it fits (dlrm/placement/memory_check.py's check at the configuration's
--memory-limit, no margin); then each trained in this process on its own Trainer, interleaved:
`--rounds` rounds, each running `--steps` steps of every candidate in turn (one torch thread),
the first `--warmup` steps of each trainer not counted. Measured = the median over the counted
steps of the step thread's CPU time plus the time it waited for a staging (the collection's
`exposed_gather_s`): on a shared machine wall time holds the neighbours' time slices (reported
beside it, with the error against it). A tiered trainer starts as a run does, its row cache
empty and its tier file unwritten (a miss on a never-written row is computed, not read), so its
step time changes as the cache fills: it runs `--tiered-steps` counted steps, spread over the
rounds, measured as their mean, and is predicted for the same steps of the run (the planning
sample's `steps`). `counted_hit_rate` is the cache's hit rate over the counted steps. Every
trainer runs the epoch's batches the profile did not count (the prediction's sample is of
those; a counted batch has no cold row the profile missed).

Reported: predicted vs measured per candidate, auto's choice (`chosen`, the planner's decision),
the measured fastest that fits, whether the choice is within 10% of it, the median prediction
error for device/host/FAE and for Hotline/tiered, absolute and as a multiple of the device
placement's step in the same rounds (`error_vs_device`: the machine's drift between runs
cancels there), the noise floor they are read against (the
device placement measured twice, on two trainers in the same rounds: `repeatability`; each
candidate's spread between its rounds' medians: `round_medians_ms`, `round_spread_median`),
the planner's wall time (`planning_s`), every pair the prediction ranked against the
measurement (with both candidates' errors), CPU model and flags, load average.
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data_pipeline.synthetic import scaled_table_sizes  # noqa: E402
from dlrm import TrainConfig  # noqa: E402
from dlrm.data import build_data  # noqa: E402
from dlrm.errors import ConfigError  # noqa: E402
from dlrm.placement.auto import counted_batches, plan, read_sample  # noqa: E402
from dlrm.placement.candidates import Candidate  # noqa: E402
from dlrm.placement.memory_check import check_memory, run_tables  # noqa: E402
from embeddings.hot_rows import row_bytes  # noqa: E402
from hybrid_dlrm.common.machine import cpu_model  # noqa: E402
from perfmodel.placement_costs import predict_candidate  # noqa: E402
from scripts._shared import check_bench_out, cpu_flags, load_average  # noqa: E402

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
AGAIN = "device (again)"


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
    total = sum(sizes) * row_bytes(cfg.arch.sparse_feature_size, cfg.training.sparse_optimizer())
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
    return cfg.replace(**fields)


def auto_decision(cfg: TrainConfig, profile_path: Path, rate: float):
    """`--placement auto`'s own decision for `cfg` (dlrm/placement/auto.py's `plan`, on the CPU) and
    its wall time: the inventory, the access profile (`rate` of the epoch-0 batches, written to
    `profile_path` for every measured candidate to reuse), the planning sample and a prediction
    of every candidate that fits; then the planner's sample, read again from that profile, for
    the bench's own candidates."""
    auto = cfg.replace(placement="auto", profile_file=str(profile_path), profile_sample_rate=rate)
    data = build_data(auto)
    t0 = time.perf_counter()
    decision = plan(auto, data, torch.device("cpu"), write=True)
    planning_s = time.perf_counter() - t0
    sample = read_sample(auto, data, run_tables(auto, data), None, write=False)
    return decision, planning_s, sample


def fits(cfg: TrainConfig) -> tuple[bool, str | None]:
    try:
        check_memory(cfg, build_data(cfg), torch.device("cpu"))
        return True, None
    except ConfigError as e:
        return False, str(e)


def _exposed(trainer) -> float:
    """Seconds the step thread has waited for stagings so far (0 without staging)."""
    coll = trainer.model.embeddings
    return float(coll.counters().get("exposed_gather_s", 0.0)) if hasattr(coll, "store") else 0.0


def _counters(trainer) -> dict:
    coll = trainer.model.embeddings
    return dict(coll.counters()) if hasattr(coll, "counters") else {}


def uncounted(batches, counted: set[int]):
    """The epoch's batches the profile did not count: a counted batch has no cold row the
    profile missed (none at all where the hot budget holds every row it saw), and the prediction
    is of the others (dlrm/placement/auto.py's sample takes none of the counted)."""
    return (b for j, b in enumerate(batches) if j not in counted)


def measure(cfgs: dict[str, TrainConfig], args, counted: set[int]) -> dict[str, dict]:
    trainers, streams, wall, cpu, done = {}, {}, {}, {}, {}
    from dlrm.trainer import Trainer

    steps, per_round = {}, {}  # each trainer's steps in all, and per round
    for name, cfg in cfgs.items():
        trainers[name] = Trainer(cfg, checkpoints=False)
        streams[name] = uncounted(trainers[name].data.train.batches(0, 0), counted)
        wall[name], cpu[name], done[name] = [], [], 0
        tiered = cfg.placing.placement == "tiered"
        steps[name] = args.warmup + (args.tiered_steps if tiered else args.rounds * args.steps)
        per_round[name] = -(-steps[name] // args.rounds)
    waited = {name: [] for name in trainers}
    by_round = {name: [] for name in trainers}  # each round's counted steps' median
    at_start: dict[str, dict] = {}  # counters when counting starts
    for _ in range(args.rounds):
        for name, tr in trainers.items():
            first = len(cpu[name])
            for _ in range(min(per_round[name], steps[name] - done[name])):
                if done[name] >= args.warmup and name not in at_start:
                    at_start[name] = _counters(tr)
                e0 = _exposed(tr)
                w0, c0 = time.perf_counter(), time.thread_time()
                tr.pipeline.progress(streams[name])
                if done[name] >= args.warmup:
                    wall[name].append(time.perf_counter() - w0)
                    cpu[name].append(time.thread_time() - c0)
                    waited[name].append(_exposed(tr) - e0)
                done[name] += 1
            if len(cpu[name]) > first:
                steps_ms = [c + w for c, w in zip(cpu[name][first:], waited[name][first:])]
                by_round[name].append(round(statistics.median(steps_ms) * 1e3, 3))
            # its staging worker finishes here, not beside the next trainer's steps
            getattr(tr.pipeline, "settle", lambda: None)()
    out = {}
    for name, tr in trainers.items():
        counters = _counters(tr)
        first = at_start.get(name, {})
        hits = counters.get("scm_cache_hits", 0) - first.get("scm_cache_hits", 0)
        misses = counters.get("scm_cache_misses", 0) - first.get("scm_cache_misses", 0)
        keep = ("cold_rows_per_batch", "hidden_share", "scm_cache_hit_rate", "scm_bytes_read",
                "scm_rows_read", "popular_input_share")  # fmt: skip
        # the step thread's CPU time plus what it waited for stagings: on a shared machine wall
        # time holds the neighbours' time slices; thread CPU time is what the model predicts
        step = [c + w for c, w in zip(cpu[name], waited[name])]
        # a tiered run's steps change as its cache fills: their mean is its time per step
        avg = statistics.mean if cfgs[name].placing.placement == "tiered" else statistics.median
        out[name] = {
            "measured_ms": round(avg(step) * 1e3, 3),
            "measured_as": avg.__name__,
            "measured_wall_ms": round(statistics.median(wall[name]) * 1e3, 3),
            "measured_cpu_ms": round(statistics.median(cpu[name]) * 1e3, 3),
            "exposed_wait_ms": round(statistics.mean(waited[name]) * 1e3, 3),
            "steps_counted": len(wall[name]),
            "round_medians_ms": by_round[name],
            "warmup_steps": done[name] - len(wall[name]),
            # over the counted steps only (the counters' own rate includes the warm-up)
            "counted_hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
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


def with_chosen(fixed: list[Candidate], chosen: Candidate) -> list[Candidate]:
    """The bench's candidates and auto's choice, measured too where it is not one of them."""
    return fixed if chosen in fixed else [*fixed, chosen]


def judge(rows: dict, chosen: str) -> dict:
    """Auto's choice against the measured fastest of the candidates that fit the limit."""
    fitting = {n: r for n, r in rows.items() if r["fits"]}
    fastest = min(fitting, key=lambda n: fitting[n]["measured_ms"]) if fitting else None
    within = None
    if fastest is not None:
        within = rows[chosen]["measured_ms"] <= 1.10 * rows[fastest]["measured_ms"]
    return {"chosen": chosen, "measured_fastest_that_fits": fastest,
            "measured_fastest": min(rows, key=lambda n: rows[n]["measured_ms"]),
            "chosen_within_10pct": within,
            "chosen_vs_fastest": None if fastest is None else round(
                rows[chosen]["measured_ms"] / rows[fastest]["measured_ms"] - 1, 4)}  # fmt: skip


def run_config(spec, args, root: Path) -> dict:
    name, scale, batch, room = spec
    limit = None if room is None else resident_bytes() + room
    out = root / name
    cfg = base_config(scale, batch, limit, args, out)
    sizes = list(cfg.arch.embedding_size)
    profile = out / "profile.npz"
    out.mkdir(parents=True, exist_ok=True)
    predict = predict_candidate
    decision, planning_s, sample = auto_decision(cfg, profile, args.profile_batches / args.batches)
    if not profile.is_file():  # device fitted: the planner made no profile; the runs need one
        sample.profile.save(profile)
    rows, cfgs = {}, {}
    # the steps of the run a tiered trainer is measured over (`measure`)
    sample.steps = (args.warmup, args.warmup + args.tiered_steps)
    for c in with_chosen(candidates(cfg, sizes, args.quick), decision.chosen):
        ccfg = with_candidate(cfg, c, out, profile)
        p0 = time.perf_counter()
        pred = predict(ccfg, c, sample)
        if room is not None:  # --memory-limit counts what the process holds now
            ccfg = ccfg.replace(memory_limit=resident_bytes() + room)
        ok, why = fits(ccfg)
        rows[c.label()] = {
            "placement": c.placement, "hot_budget": c.hot_budget, "scm_cache": c.scm_cache,
            "predicted_ms": round(pred.ms_per_step, 3),
            "parts": {k: round(v, 3) for k, v in pred.parts.to_json().items()},
            "detail": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in pred.detail.items()},
            "fits": ok, "rejected": why, "predict_s": round(time.perf_counter() - p0, 3),
        }  # fmt: skip
        # measured on this machine whether or not it fits the limit (the limit decides the choice)
        cfgs[c.label()] = ccfg.replace(memory_limit=None)
    chosen = decision.chosen.label()
    rows[chosen]["auto"] = True
    rows[chosen]["planner_predicted_ms"] = decision.predicted_ms()
    # the device placement a second time, on its own trainer in the same rounds: how far two
    # measurements of one configuration land apart here (the error's noise floor)
    cfgs[AGAIN] = cfgs["device"].replace(out_dir=str(out / "device-again"))
    measured = measure(
        cfgs, args, set(counted_batches(args.batches, args.profile_batches / args.batches))
    )
    again = measured.pop(AGAIN)
    for n, r in rows.items():
        r.update(measured[n])
        r["error"] = round((r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"], 4)
        r["error_vs_wall"] = round(
            (r["predicted_ms"] - r["measured_wall_ms"]) / r["measured_wall_ms"], 4
        )
    for n, r in rows.items():  # against the device placement measured in the same rounds
        r["error_vs_device"] = relative_error(r, rows["device"]) if n != "device" else None
    weighed = decision.weighed
    return {
        "table_scale": scale, "rows": sum(sizes), "batch": batch, "memory_limit": limit, "room": room,
        "candidates": rows, **judge(rows, chosen), "how": decision.how,
        "planner_weighed": len(weighed),
        "planner_predicted": sum(w.prediction is not None for w in weighed),
        "planning_s": round(planning_s, 2), "wrong_rankings": wrong_pairs(rows),
        "device_again_ms": again["measured_ms"],
        "repeatability": round(abs(again["measured_ms"] / rows["device"]["measured_ms"] - 1), 4),
        "load": load_average(),
    }  # fmt: skip


def relative_error(r: dict, device: dict) -> float:
    """The error of a candidate's step time as a multiple of the device placement's, predicted
    against measured in the same rounds: the machine's drift between runs (1.6x within half an
    hour here) cancels, which the choice between placements depends on."""
    predicted = r["predicted_ms"] / device["predicted_ms"]
    return round(predicted / (r["measured_ms"] / device["measured_ms"]) - 1, 4)


def summarise(configs: dict) -> dict:
    errs: dict[str, list[float]] = {g: [] for g in TARGETS}
    rel: dict[str, list[float]] = {g: [] for g in TARGETS}
    for c in configs.values():
        for r in c["candidates"].values():
            errs[GROUPS[r["placement"]]].append(abs(r["error"]))
            if r.get("error_vs_device") is not None:
                rel[GROUPS[r["placement"]]].append(abs(r["error_vs_device"]))
    out = {}
    for g, e in errs.items():
        med = statistics.median(e) if e else None
        rmed = statistics.median(rel[g]) if rel[g] else None
        out[g] = {"median_abs_error": None if med is None else round(med, 4), "n": len(e),
                  "target": TARGETS[g], "met": None if med is None else med <= TARGETS[g],
                  "median_abs_error_vs_device": None if rmed is None else round(rmed, 4),
                  "n_vs_device": len(rel[g]),
                  "met_vs_device": None if rmed is None else rmed <= TARGETS[g]}  # fmt: skip
    within = [c["chosen_within_10pct"] for c in configs.values()]
    out["chosen_within_10pct"] = f"{sum(bool(w) for w in within)}/{len(within)}"
    out["wrong_rankings"] = sum(len(c["wrong_rankings"]) for c in configs.values())
    out["planning_s_max"] = max(c["planning_s"] for c in configs.values())
    # the noise floor the errors are read against: two trainers of one configuration, and one
    # trainer's rounds (minutes apart)
    out["repeatability_median"] = round(
        statistics.median(c["repeatability"] for c in configs.values()), 4
    )
    spreads = [max(r["round_medians_ms"]) / min(r["round_medians_ms"]) - 1
               for c in configs.values() for r in c["candidates"].values()
               if len(r["round_medians_ms"]) > 1]  # fmt: skip
    out["round_spread_median"] = round(statistics.median(spreads), 4) if spreads else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two tiny configurations (smoke test)")
    p.add_argument("--only", help="comma-separated configuration names")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=15, help="steps of each candidate per round")
    p.add_argument("--warmup", type=int, default=10, help="first steps of each trainer not counted")
    p.add_argument("--tiered-steps", type=int, default=240,
                   help="counted steps of each tiered trainer (its cache starts empty and fills: "
                   "measured as their mean, predicted for the same steps)")  # fmt: skip
    p.add_argument("--batches", type=int, default=400, help="training batches per epoch")
    p.add_argument("--profile-batches", type=int, default=100, help="batches the profile counts")
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
        args.tiered_steps = min(args.tiered_steps, 20)
        args.batches, args.profile_batches = 40, 10
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    specs = QUICK if args.quick else CONFIGS
    if args.only:
        want = set(args.only.split(","))
        specs = [s for s in specs if s[0] in want]
        if not specs:
            p.error(f"--only: none of {sorted(want)} is a configuration")
    root = Path(args.out_dir or f"runs/bench_planner-{time.strftime('%Y%m%d-%H%M%S')}")
    check_bench_out(root, ["configs.jsonl"], False, p.prog, "--out-dir")  # the output rule
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
