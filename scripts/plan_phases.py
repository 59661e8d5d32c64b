"""Where `--placement auto`'s planning time goes, phase by phase, and how much work each does
(issue 44: Kaggle-size under 5 s, Terabyte-size under 30 s, without the calibration and trial).

    HYBRID_DLRM_CALIBRATE=off python scripts/plan_phases.py -- --hot-budget 8MB
    python scripts/plan_phases.py -- --memory-limit 2.5GB --synthetic-table-scale 1 \
        --data-size 40960

Plans as `python -m perfmodel plan` does (the trainer's flags after `--`; nothing is written,
no trial) with each phase's function wrapped: seconds and calls per phase, and the work counted
(rows the profile counted, batches read, candidates weighed and predicted, cache replays and the
row ids they fed the cache). The calibration (`load_model`, cached per machine) is its own
phase, so the planning without it is `planning_s - calibration`. Prints one JSON object with
the decision, the load average and the CPU flags: on a shared machine timings are indicative;
the counts are not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _shared import load_average  # noqa: E402

SECONDS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
WORK: dict[str, int] = defaultdict(int)
WRAPPED: list[tuple] = []  # (owner, name, the original): put back when the plan is made


def _wrap(owner, name: str, phase: str, work=None) -> None:
    """Time `owner.name` as `phase` (nested phases count in their own and their caller's)."""
    fn = getattr(owner, name)
    WRAPPED.append((owner, name, fn))

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            SECONDS[phase] += time.perf_counter() - t0
            CALLS[phase] += 1
            if work is not None:
                for key, n in work(*a, **k).items():
                    WORK[key] += int(n)

    setattr(owner, name, timed)


def _alias(user, owner, name: str) -> None:
    """`user.name` (imported from `owner`) is `owner`'s wrapped one too."""
    WRAPPED.append((user, name, getattr(user, name)))
    setattr(user, name, getattr(owner, name))


def _instrument() -> None:
    from dlrm.placement import auto, candidates, enumerator, run_plan
    from perfmodel import model, placement_costs, row_cache_model

    _wrap(auto.RunMemory, "room", "inventory")
    _wrap(auto.RunMemory, "base", "dense needs")
    _wrap(auto, "check_batch", "memory check (batch)")
    _wrap(auto, "read_sample", "planning sample (profile + batches)")

    def counted(source, names, sizes, rate):
        n = len(source)
        return {"profile batches": len(run_plan.profiled_batches(n, rate))}

    _wrap(run_plan, "profile_training_sample", "access profile", counted)
    _wrap(auto, "obtain_profile", "access profile (made or read)")
    _wrap(auto, "hot_budgets", "hot budgets")
    _wrap(auto, "Coverage", "coverage (ranking)")
    _wrap(enumerator.Coverage, "all_hot", "coverage (all-hot inputs)")
    _wrap(auto, "_drop_degenerate", "degenerate candidates")
    _wrap(enumerator.CandidateSpace, "weigh", "weigh (memory needs)")
    _wrap(enumerator.Enumerator, "__call__", "enumerate (incl. weighs)")
    _wrap(candidates.KindPredictor, "__call__", "predict (all candidates)")
    _wrap(model, "load_model", "calibration (load or fit the model)")
    _wrap(placement_costs, "_fitted_model", "fitted model lookup")
    _wrap(placement_costs, "hot_plan", "hot plan per budget")
    _wrap(placement_costs, "hot_row_map", "hot map per budget")

    def cold_work(batches, plan, timed=True, hot=None):
        return {"batches mapped": len(batches),
                "lookups mapped": sum(int(b.values().numel()) for b in batches)}  # fmt: skip

    _wrap(placement_costs, "cold_batches", "cold rows per batch (map_lookups)", cold_work)
    _wrap(placement_costs, "step_time", "step time (captured / roofline)")

    def replay_work(batches, total_rows, capacity, *a, warm=(), **k):
        return {"cache replays": 1, "replayed row ids": sum(int(b.numel()) for b in batches),
                "warm row ids": sum(int(w.numel()) for w in warm)}  # fmt: skip

    _wrap(row_cache_model, "replay_row_cache", "cache replay", replay_work)
    _alias(placement_costs, row_cache_model, "replay_row_cache")
    _wrap(row_cache_model, "run_io", "run_io (replay + extrapolation)")
    _alias(placement_costs, row_cache_model, "run_io")
    _wrap(row_cache_model, "warm_rows", "warm rows (profile-ranked cache)")
    _alias(placement_costs, row_cache_model, "warm_rows")
    _wrap(row_cache_model, "seen_rows", "seen rows (ranked)")
    _alias(placement_costs, row_cache_model, "seen_rows")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="plan_phases.py", description=__doc__.splitlines()[0])
    p.parse_args(own)
    from dlrm.build import resolve_device
    from dlrm.config import TrainConfig
    from dlrm.data import build_data
    from dlrm.errors import ConfigError
    from dlrm.placement.auto import Planner
    from dlrm.placement.candidates import KindPredictor
    from dlrm.train import build_parser
    from perfmodel.placement_costs import PlacementCosts

    with tempfile.TemporaryDirectory(prefix="plan-phases-") as out:
        try:
            args = vars(build_parser().parse_args(["--out-dir", out, *flags]))
            args["placement"] = "auto"
            cfg = TrainConfig(**args)
        except ConfigError as e:
            sys.stderr.write(f"{p.prog}: error: {e}\n")
            return 2
        t0 = time.perf_counter()
        data = build_data(cfg)
        data_s = time.perf_counter() - t0
        for table in (SECONDS, CALLS, WORK):
            table.clear()
        _instrument()
        try:
            planner = Planner(predictor=KindPredictor(PlacementCosts()), trials=None)
            decision = planner.plan(cfg, data, resolve_device(cfg.training.device), write=False)
        finally:
            while WRAPPED:
                owner, name, fn = WRAPPED.pop()
                setattr(owner, name, fn)
    weighed = decision.weighed
    print(json.dumps({
        "flags": flags, "chosen": decision.chosen.label(), "decision": decision.to_json(), "planning_s": round(decision.planning_s, 2),
        "without_calibration_s": round(decision.planning_s - SECONDS.get(
            "calibration (load or fit the model)", 0.0), 2),
        "build_data_s": round(data_s, 2),
        "phases_s": {k: round(v, 3) for k, v in SECONDS.items()}, "calls": dict(CALLS),
        "work": {**WORK, "candidates weighed": len(weighed),
                 "candidates predicted": sum(w.prediction is not None for w in weighed)},
        "load_average": load_average(),
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
