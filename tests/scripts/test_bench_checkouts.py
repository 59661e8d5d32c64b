"""scripts/bench_checkouts.py: counted fields equal on both sides are `identical`, a field that is
steady on each side but changed between them is `differs`, timer noise is neither."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_checkouts.py"

BENCH = """import json, random
print("warming up")
print(json.dumps({{"rows": 42, "auc": {auc}, "speed": {{"samples_per_s": random.random()}}}}))
"""


def _checkout(root: Path, auc: float) -> Path:
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "bench.py").write_text(BENCH.format(auc=auc))
    return root


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_identical_and_changed_fields_are_told_apart(tmp_path):
    old, new = _checkout(tmp_path / "old", 0.7), _checkout(tmp_path / "new", 0.71)
    done = _run("--old", str(old), "--new", str(new), "--rounds", "2", "--", "scripts/bench.py")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["identical"] == ["rows"]
    assert report["differs"] == ["auc"]
    assert report["fields"]["auc"]["ratio"] == 0.71 / 0.7
    assert "speed.samples_per_s" in report["fields"]


def test_a_failing_benchmark_is_one_line(tmp_path):
    old = _checkout(tmp_path / "old", 0.7)
    (old / "scripts" / "bench.py").write_text("raise SystemExit('bench: no data here')\n")
    new = _checkout(tmp_path / "new", 0.7)
    done = _run("--old", str(old), "--new", str(new), "--", "scripts/bench.py")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"{old}: scripts/bench.py exited 1: bench: no data here"
    ]
