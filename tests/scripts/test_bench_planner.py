"""What bench_planner judges the planner on, from made-up predictions and measurements."""

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "bench_planner", Path(__file__).resolve().parents[2] / "scripts" / "bench_planner.py"
)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def row(placement, predicted, measured, fits=True, parts=None, rounds=None, vs_device=None):
    return {"placement": placement, "predicted_ms": predicted, "measured_ms": measured,
            "fits": fits, "parts": parts or {"dense": predicted},
            "error": round((predicted - measured) / measured, 4),
            "round_medians_ms": rounds or [measured], "error_vs_device": vs_device}  # fmt: skip


def test_autos_choice_is_judged_against_the_measured_fastest_that_fits():
    rows = {"device": row("device", 5.0, 5.0, fits=False), "host": row("host", 6.0, 6.5),
            "hotline": row("hotline", 5.5, 7.2), "tiered": row("tiered", 9.0, 7.1)}  # fmt: skip
    j = bench.judge(rows, "tiered")
    assert j["measured_fastest_that_fits"] == "host" and j["measured_fastest"] == "device"
    assert j["chosen"] == "tiered" and j["chosen_within_10pct"] is True
    assert j["chosen_vs_fastest"] == round(7.1 / 6.5 - 1, 4)
    assert bench.judge(rows, "hotline")["chosen_within_10pct"] is False  # 10.8% slower
    assert bench.judge({"device": row("device", 5.0, 5.0, fits=False)}, "device")[
        "chosen_within_10pct"] is None  # fmt: skip


def test_autos_choice_is_measured_where_the_bench_lacks_it():
    fixed = [bench.Candidate("device"), bench.Candidate("hotline", 1024)]
    assert bench.with_chosen(fixed, bench.Candidate("hotline", 1024)) == fixed
    assert bench.with_chosen(fixed, bench.Candidate("tiered", 1024, 65536)) == [
        *fixed, bench.Candidate("tiered", 1024, 65536)]  # fmt: skip


def test_wrong_rankings_name_the_pair_and_the_larger_error():
    rows = {
        "a": row("device", 5.0, 6.0),
        "b": row("hotline", 5.5, 5.0),
        "c": row("tiered", 9.0, 9.5),
    }
    wrong = bench.wrong_pairs(rows)
    assert [w["pair"] for w in wrong] == [["a", "b"]]
    w = wrong[0]
    assert w["predicted_ms"] == [5.0, 5.5] and w["measured_ms"] == [6.0, 5.0]
    assert w["measured_gap"] == 0.2
    assert w["larger_error"] == "a" and w["errors"] == [rows["a"]["error"], rows["b"]["error"]]


def test_summary_medians_per_group_against_the_targets():
    configs = {
        "x": {"candidates": {"device": row("device", 10.0, 10.5, rounds=[10.0, 12.0]),
                             "fae": row("fae", 12.0, 10.0, rounds=[10.0, 11.0, 10.5],
                                        vs_device=0.26),
                             "hotline": row("hotline", 11.0, 10.0, vs_device=-0.155)},
              "chosen_within_10pct": True, "wrong_rankings": [], "planning_s": 3.0,
              "repeatability": 0.05},
        "y": {"candidates": {"host": row("host", 9.0, 10.0, rounds=[8.0, 10.0], vs_device=0.04),
                             "tiered": row("tiered", 20.0, 10.0, vs_device=0.05)},
              "chosen_within_10pct": False, "wrong_rankings": [{}], "planning_s": 7.5,
              "repeatability": 0.15},
    }  # fmt: skip
    s = bench.summarise(configs)
    assert s["device_fae"]["n"] == 3 and s["staged"]["n"] == 2
    assert s["device_fae"]["median_abs_error"] == 0.1 and s["device_fae"]["met"] is True
    assert s["staged"]["median_abs_error"] == 0.55 and s["staged"]["met"] is False
    assert s["chosen_within_10pct"] == "1/2" and s["wrong_rankings"] == 1
    assert s["planning_s_max"] == 7.5
    # the noise floor: the median of the configurations' repeatability, and of the spreads of
    # the candidates measured in more than one round (20%, 10%, 25%)
    assert s["repeatability_median"] == 0.1 and s["round_spread_median"] == 0.2
    # against the device placement of the same rounds (the device itself has none)
    assert (
        s["device_fae"]["n_vs_device"] == 2
        and s["device_fae"]["median_abs_error_vs_device"] == 0.15
    )
    assert s["device_fae"]["met_vs_device"] is False
    assert s["staged"]["median_abs_error_vs_device"] == 0.1025 and s["staged"]["met_vs_device"]


def test_the_error_against_the_device_cancels_the_machines_drift():
    device = row("device", 10.0, 10.0)
    hotline = row("hotline", 12.0, 12.0)
    slow = {k: dict(r, measured_ms=r["measured_ms"] * 1.6) for k, r in
            {"device": device, "hotline": hotline}.items()}  # fmt: skip
    assert bench.relative_error(hotline, device) == 0.0
    assert bench.relative_error(slow["hotline"], slow["device"]) == 0.0  # both 1.6x slower
    assert bench.relative_error(row("hotline", 12.0, 15.0), device) == round(1.2 / 1.5 - 1, 4)


def test_quick_candidates_cover_every_kind_but_host():
    cfg = bench.base_config(0.002, 128, None, _Args(), Path("/nonexistent"))
    kinds = [c.placement for c in bench.candidates(cfg, list(cfg.arch_embedding_size), True)]
    assert kinds == ["device", "fae", "hotline", "tiered"]
    full = bench.candidates(cfg, list(cfg.arch_embedding_size), False)
    assert sorted({c.placement for c in full}) == ["device", "fae", "host", "hotline", "tiered"]


class _Args:
    dim, mlp_bot, mlp_top, zipf, batches = 16, "13-64-16", "64-1", 1.05, 40


def test_the_runs_skip_the_batches_the_profile_counted():
    assert list(bench.uncounted(iter("abcdefgh"), {0, 4, 5})) == list("bcdgh")
