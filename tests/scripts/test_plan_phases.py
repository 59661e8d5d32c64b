"""scripts/plan_phases.py: the planning's phases timed and its work counted, the functions it
wrapped put back afterwards. No timings are asserted."""

import importlib.util
import json
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "plan_phases", Path(__file__).resolve().parents[2] / "scripts" / "plan_phases.py"
)
phases = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(phases)


def test_the_work_counted_is_the_plans_and_the_wrapped_functions_are_put_back(capsys):
    from perfmodel import placement_costs, row_cache_model

    before = (row_cache_model.replay_row_cache, placement_costs.run_io)
    # 256 steps: past the checked first steps, so a tiered prediction has two windows
    flags = ["--hot-budget", "64KB", "--data-size", "32768", "--mini-batch-size", "128"]
    assert phases.main(["--", *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    decision = out["decision"]
    predicted = [c for c in decision["candidates"] if c["ms_per_step"] is not None]
    tiered = [c for c in predicted if c["placement"] == "tiered"]
    assert out["chosen"] == decision["chosen"] and tiered
    assert out["calls"]["predict (all candidates)"] == len(predicted)
    assert out["work"]["candidates predicted"] == len(predicted)
    # each tiered prediction: its two windows share one replay of the stream (three before)
    assert out["calls"]["run_io (replay + extrapolation)"] == 2 * len(tiered)
    assert out["work"]["cache replays"] <= 2 * len(tiered)
    assert set(decision["planning_phases_s"]) == {"inventory", "sample", "candidates",
                                                   "prediction"}  # fmt: skip
    assert (row_cache_model.replay_row_cache, placement_costs.run_io) == before
