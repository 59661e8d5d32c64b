"""One benchmark, two checkouts, interleaved: did a change move what the benchmark measures?

    python scripts/bench_checkouts.py --old /path/to/old --new . --rounds 3 -- \
        scripts/bench_placement.py --table-scale 0.05 --train-samples 200000

Runs `python SCRIPT ARGS...` with each checkout's code (its root first on PYTHONPATH, the script
taken from that checkout, the working directory that checkout), old then new, `--rounds` times,
so a drift of the shared machine's speed over minutes falls on both alike. Each run must print
one JSON object (the last line of its stdout that parses as one). `{tmp}` in an argument becomes
a fresh empty directory for each run (benchmarks that refuse an existing output directory). Prints one JSON object: for
every numeric field the runs share (nested fields as dotted paths), each side's median and the
new/old ratio of the medians; `identical` lists the fields equal in every run of both (counted
quantities such as bytes and AUCs of a deterministic run belong there), `differs` the fields that
were the same in every run of one side but not equal across the two (a changed result rather
than timer noise), with the machine's CPU flags and load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _shared import cpu_flags, load_average  # noqa: E402


def _flatten(value, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix[:-1]] = float(value)
    return out


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    # a pretty-printed object spans lines: the tail from the last line that opens one
    lines = text.splitlines(keepends=True)
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                value = json.loads("".join(lines[i:]))
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return {}


def run_once(root: Path, script: str, args: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(root))
    with tempfile.TemporaryDirectory(prefix="bench-checkouts-") as tmp:
        args = [a.replace("{tmp}", str(Path(tmp) / "out")) for a in args]
        done = subprocess.run([sys.executable, str(root / script), *args], cwd=root, env=env,
                              capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"{root}: {script} exited {done.returncode}: {tail[0]}")
    return _flatten(_last_json(done.stdout))


def compare(old: list[dict[str, float]], new: list[dict[str, float]]) -> dict:
    shared = sorted(set.intersection(*(set(r) for r in old + new)))
    fields, identical, differs = {}, [], []
    for key in shared:
        a, b = [r[key] for r in old], [r[key] for r in new]
        ma, mb = statistics.median(a), statistics.median(b)
        fields[key] = {"old": ma, "new": mb, "ratio": (mb / ma) if ma else None,
                       "old_spread": [min(a), max(a)], "new_spread": [min(b), max(b)]}  # fmt: skip
        if len(set(a + b)) == 1:
            identical.append(key)
        elif len(set(a)) == 1 and len(set(b)) == 1:
            differs.append(key)
    return {"fields": fields, "identical": identical, "differs": differs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", type=Path, required=True, help="the baseline checkout's root")
    p.add_argument("--new", type=Path, required=True, help="the changed checkout's root")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    a = p.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("give the benchmark after --, e.g. -- scripts/bench_placement.py --rounds 1")
    if a.rounds < 1:
        p.error("--rounds: expected a positive integer")
    for root in (a.old, a.new):
        if not (root / command[0]).is_file():
            p.error(f"{root / command[0]}: no such script in that checkout")
    old, new, loads, t0 = [], [], [load_average()], time.time()
    for _ in range(a.rounds):
        old.append(run_once(a.old.resolve(), command[0], command[1:]))
        new.append(run_once(a.new.resolve(), command[0], command[1:]))
        loads.append(load_average())
    report = {"command": command, "rounds": a.rounds, "old": str(a.old), "new": str(a.new),
              "seconds": round(time.time() - t0, 1), "load_average": loads,
              "cpu_flags": cpu_flags(), **compare(old, new)}  # fmt: skip
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
