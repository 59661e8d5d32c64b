"""The performance model profiles steps (graph capture, --perf-log, auto's planning); torch's
profiler must not print its USDT start/stop lines to the user's terminal."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_profiling_through_the_model_prints_nothing():
    code = (
        "import perfmodel, torch\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "with profile(activities=[ProfilerActivity.CPU]):\n"
        "    torch.ones(4).sum()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "profiler_start" not in out.stderr and "USDT" not in out.stderr, out.stderr
