import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "host_noise", Path(__file__).resolve().parents[2] / "scripts" / "host_noise.py"
)
host_noise = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host_noise)


def test_summary_counts_slow_samples_and_runs_against_the_10th_percentile():
    fast, slow = 100.0, 150.0
    step = [fast] * 6 + [slow, slow, slow, fast, slow, fast, fast, fast, fast, fast]
    canary = [1.0 if s == fast else 1.5 for s in step]
    out = host_noise.summarize({"step": step, "canary": canary}, described_canary_us=0.5)
    assert out["canary_slowdown_median"] == 2.0 and "described_canary_us" not in out
    s = out["step"]
    assert out["samples"] == 16 and s["p10_us"] == fast
    assert s["slow_share"] == pytest.approx(4 / 16) and s["longest_slow_run"] == 3
    assert s["median_over_p10"] == 1.0 and s["p90_over_p10"] == pytest.approx(1.5)
    assert s["corr_with_canary"] == pytest.approx(1.0)
