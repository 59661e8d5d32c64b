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


def test_steal_share_reads_the_steal_column_of_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 20 800 10 0 5 65 0 0\ncpu0 50 0 10 400 5 0 2 33 0 0\n")
    before = host_noise.cpu_times(str(stat))
    assert before == (65, 1000)
    stat.write_text("cpu  150 0 30 900 10 0 5 105 0 0\n")
    after = host_noise.cpu_times(str(stat))
    assert host_noise.steal_share(before, after) == pytest.approx(40 / 200)
    assert host_noise.steal_share(before, None) is None
    assert host_noise.cpu_times(str(tmp_path / "missing")) is None
