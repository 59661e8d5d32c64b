"""What checkpoint verification costs. Prints JSON.

    python scripts/bench_checkpoint.py RUN_DIR/checkpoints/step_000000004.pt [--repeats 3]
    python scripts/bench_checkpoint.py --resume-pairs 5 -- TRAIN_FLAGS --out-dir RUN_DIR

The first times, in one process, torch.load alone (weights_only=True: what `load` did before
checksums), the verification `load` adds, and the checksums a save computes; the minimum of the
repeats. The second runs `python -m dlrm.train TRAIN_FLAGS --resume` end to end, alternately as it
is and with the verification patched out (the baseline), and reports the medians of the whole
command and of the checkpoint load inside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from dlrm import checkpoint as ckpt

# One resume, verified or not, timed from inside: the whole command and the checkpoint load.
_RESUME = """
import json, sys, time
t0 = time.perf_counter()
import dlrm.checkpoint as c
if sys.argv[1] == "unverified":
    c._verify = lambda data, path: data.pop(c.CHECKSUMS)
real_load = c.load
def timed_load(path):
    t = time.perf_counter()
    data = real_load(path)
    timed_load.s = time.perf_counter() - t
    return data
c.load = timed_load
from dlrm.train import main
rc = main(sys.argv[2:] + ["--resume"])
print(json.dumps({"rc": rc, "load_s": timed_load.s, "total_s": time.perf_counter() - t0}))
"""


def in_process(path: Path, repeats: int) -> dict:
    loads, verifies, hashing = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        data = torch.load(path, map_location="cpu", weights_only=True)
        loads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ckpt._verify(data, path)  # what `load` adds to torch.load
        verifies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ckpt.checksums(data)  # what `save` adds to torch.save
        hashing.append(time.perf_counter() - t0)
        del data
    return {
        "file_bytes": path.stat().st_size,
        "threads": ckpt._THREADS,
        "torch_load_s": min(loads),
        "verify_s": min(verifies),
        "checksums_on_save_s": min(hashing),
    }


def resume_pairs(pairs: int, train_flags: list[str]) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=root)
    runs: dict[str, list[dict]] = {"verified": [], "unverified": []}
    for _ in range(pairs):
        for mode in runs:
            argv = [sys.executable, "-c", _RESUME, mode, *train_flags]
            out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            assert result["rc"] == 0, out.stderr
            runs[mode].append(result)

    def median(mode: str, key: str) -> float:
        values = sorted(r[key] for r in runs[mode])
        return values[len(values) // 2]

    report = {m: {k: median(m, k) for k in ("load_s", "total_s")} for m in runs}
    added = report["verified"]["total_s"] - report["unverified"]["total_s"]
    report["added_s"] = added
    report["added_share"] = added / report["unverified"]["total_s"]
    return report


def main() -> None:
    argv, train_flags = sys.argv[1:], []
    if "--" in argv:  # what follows are dlrm.train's flags
        argv, train_flags = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", type=Path, nargs="?", help="a checkpoint to time in one process")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--resume-pairs", type=int, default=0, help="end-to-end resumes of each kind")
    args = p.parse_args(argv)
    if args.resume_pairs:
        report = resume_pairs(args.resume_pairs, train_flags)
    elif args.path is None:
        p.error("give a checkpoint, or --resume-pairs N -- TRAIN_FLAGS")
    else:
        report = in_process(args.path, args.repeats)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
