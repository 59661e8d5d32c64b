"""The figures bench_slipstream judges the targets on, from made-up runs."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_slipstream", Path(__file__).resolve().parents[2] / "scripts" / "bench_slipstream.py"
)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def run(auc: float, wall: float, steps: int, curve: list[tuple[float, float]], share=None) -> dict:
    evals = [(t, a, i, 0) for i, (t, a) in enumerate(curve)]
    return {
        "test_auc": auc,
        "wall_s": wall,
        "steps": steps,
        "evals": evals,
        "skipped_input_share": share,
    }


def test_ratios_auc_changes_and_time_to_target():
    rounds = [
        {"baseline": run(0.700, 12.0, 100, [(4, 0.69), (8, 0.6991), (12, 0.700)]),
         "slipstream": run(0.6995, 8.0, 80, [(4, 0.695), (8, 0.6995)], 0.2),
         "random": run(0.697, 8.0, 80, [(4, 0.69), (8, 0.697)], 0.2)},
        {"baseline": run(0.710, 10.0, 100, [(10, 0.710)]),
         "slipstream": run(0.7105, 10.0, 80, [(10, 0.7105)], 0.2),
         "random": run(0.709, 9.0, 80, [(9, 0.709)], 0.2)},
    ]  # fmt: skip
    c = bench.compare(rounds)
    first = c["per_seed"][0]
    assert first["time_ratio"] == 1.5 and first["step_ratio"] == 1.25
    # the first evaluation at or above the baseline's final AUC minus 0.001
    assert first["time_to_baseline_auc_minus_0.001_s"] == {
        "baseline": 8,
        "slipstream": 8,
        "random": None,
    }
    assert c["time_ratio"]["median"] == 1.25 and c["time_ratio"]["min"] == 1.0
    assert c["auc_change_slipstream"]["mean"] == pytest.approx(0.0)
    assert c["auc_change_random"]["mean"] == pytest.approx(-0.002)
    assert c["slipstream_minus_random_auc"]["mean"] == pytest.approx(0.002)
    assert c["targets"] == {
        "time_1.2x_less": True,
        "auc_within_0.001": True,
        "random_loses_more_auc": True,
    }
    rounds[0]["slipstream"]["test_auc"] = 0.690
    assert not bench.compare(rounds)["targets"]["auc_within_0.001"]


def test_normalization_figures_and_rounds_without_the_control():
    rounds = [
        {"baseline": run(0.700, 10.0, 100, [(10, 0.700)]),
         "slipstream": run(0.690, 8.0, 80, [(8, 0.690)], 0.2),
         "normalized": run(0.698, 8.0, 80, [(8, 0.698)], 0.18),
         "baseline_normalized": run(0.704, 10.0, 100, [(10, 0.704)], 0.0)},
        {"baseline": run(0.710, 10.0, 100, [(10, 0.710)]),
         "slipstream": run(0.706, 8.0, 80, [(8, 0.706)], 0.2),
         "normalized": run(0.702, 8.0, 80, [(8, 0.702)], 0.2),
         "baseline_normalized": run(0.708, 10.0, 100, [(10, 0.708)], 0.0)},
    ]  # fmt: skip
    c = bench.compare(rounds)
    assert "random_loses_more_auc" not in c["targets"] and "auc_change_random" not in c
    assert c["per_seed"][0]["skipped_input_share"]["normalized"] == 0.18
    n = c["normalization"]
    assert n["auc_change_normalized"]["mean"] == pytest.approx(-0.005)
    assert n["auc_change_baseline_normalized"]["mean"] == pytest.approx(0.001)
    assert n["normalized_minus_slipstream_auc"]["mean"] == pytest.approx(0.002)  # +8, -4 (1e-3)
    assert n["normalized_minus_slipstream_auc"]["min"] == pytest.approx(-0.004)
    assert n["skip_loss_normalized"]["mean"] == pytest.approx(-0.006)
