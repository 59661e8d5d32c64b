"""What checkpoint verification costs. Prints JSON.

    python scripts/bench_checkpoint.py RUN_DIR/checkpoints/step_000000004.pt [--repeats 3]
    python scripts/bench_checkpoint.py --resume-pairs 5 -- TRAIN_FLAGS --out-dir RUN_DIR

The first times, in one process, torch.load alone (weights_only=True: what `load` did before
checksums), the verification `load` adds, and the checksums a save computes, with the CRC-32 in use
(ISA-L's) and with zlib's (the same values, what was used before); the minimum of the repeats.
The second runs `python -m dlrm.train TRAIN_FLAGS --resume` end to end, in rounds of three
alternated modes: as it is ("verified"), verified with zlib's CRC-32 ("verified_zlib", the cost
before ISA-L) and with the verification patched out ("unverified", the baseline); it reports the
medians (and min/max) of the whole command, of the checkpoint load inside it (which runs on a
thread while the model is built) and of the CPU seconds the process used.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import torch

from dlrm.checkpoints import format as ckpt

# One resume, verified or not, timed from inside: the whole command and the checkpoint load.
_RESUME = """
import json, sys, time
t0 = time.perf_counter()
import dlrm.checkpoints.format as c
if sys.argv[1] == "unverified":
    c._verify = lambda data, path: data.pop(c.CHECKSUMS)
elif sys.argv[1] == "verified_zlib":
    import zlib
    c.crc32 = zlib.crc32
real_load = c.load
def timed_load(path):
    t = time.perf_counter()
    data = real_load(path)
    timed_load.s = time.perf_counter() - t
    return data
c.load = timed_load
from dlrm.train import main
rc = main(sys.argv[2:] + ["--resume"])
import resource
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rc": rc, "load_s": timed_load.s, "total_s": time.perf_counter() - t0,
                  "cpu_s": use.ru_utime + use.ru_stime}))
"""


def in_process(path: Path, repeats: int) -> dict:
    times: dict[str, list[float]] = {}

    def timed(name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        times.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    fast = ckpt.crc32
    for _ in range(repeats):
        data = timed("torch_load_s", torch.load, path, map_location="cpu", weights_only=True)
        for suffix, crc in (("", fast), ("_zlib", zlib.crc32)):
            ckpt.crc32 = crc
            timed(f"checksums_on_save{suffix}_s", ckpt.checksums, data)  # what `save` adds
            timed(f"verify{suffix}_s", ckpt._verify, dict(data), path)  # what `load` adds
        del data
    ckpt.crc32 = fast
    return {
        "file_bytes": path.stat().st_size,
        "threads": ckpt._THREADS,
        "crc32": f"{fast.__module__}.crc32",
        "load_avg": os.getloadavg(),
        **{k: round(min(v), 4) for k, v in sorted(times.items())},
    }


def resume_pairs(pairs: int, train_flags: list[str]) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=root)
    runs: dict[str, list[dict]] = {"verified": [], "verified_zlib": [], "unverified": []}
    load_avg = [os.getloadavg()]
    for _ in range(pairs):
        for mode in runs:
            argv = [sys.executable, "-c", _RESUME, mode, *train_flags]
            out = subprocess.run(argv, capture_output=True, text=True, env=env)
            if out.returncode:  # dlrm.train's own one-line error is its last stderr line
                last = (out.stderr.strip().splitlines() or ["no output"])[-1]
                raise SystemExit(f"bench_checkpoint.py: the resumed run ({mode}) failed: {last}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            assert result["rc"] == 0, out.stderr
            runs[mode].append(result)
        load_avg.append(os.getloadavg())

    def stats(mode: str, key: str) -> dict:
        values = sorted(r[key] for r in runs[mode])
        return {"median": round(values[len(values) // 2], 3), "min": round(values[0], 3),
                "max": round(values[-1], 3)}  # fmt: skip

    report: dict = {m: {k: stats(m, k) for k in ("load_s", "total_s", "cpu_s")} for m in runs}
    base = report["unverified"]["total_s"]["median"]
    for mode in ("verified", "verified_zlib"):
        added = report[mode]["total_s"]["median"] - base
        report[mode]["added_s"] = round(added, 3)
        report[mode]["added_share"] = round(added / base, 4)
        # the same within each round (the load of the machine drifts between rounds)
        paired = sorted(
            (r["total_s"] - u["total_s"]) / u["total_s"]
            for r, u in zip(runs[mode], runs["unverified"])
        )
        report[mode]["added_share_paired"] = {
            "median": round(paired[len(paired) // 2], 4),
            "min": round(paired[0], 4),
            "max": round(paired[-1], 4),
        }
        # CPU seconds (user + system) of the whole process: what verification costs in work,
        # less swayed by the load of the machine than wall time
        cpu = report[mode]["cpu_s"]["median"] - report["unverified"]["cpu_s"]["median"]
        report[mode]["added_cpu_s"] = round(cpu, 3)
    report["rounds"] = pairs
    report["load_avg_per_round"] = load_avg
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
    if args.resume_pairs and not train_flags:
        p.error(
            "--resume-pairs: give the run's dlrm.train flags after --, e.g. -- --out-dir runs/a"
        )
    if args.resume_pairs:
        report = resume_pairs(args.resume_pairs, train_flags)
    elif args.path is None:
        p.error("give a checkpoint, or --resume-pairs N -- TRAIN_FLAGS")
    else:
        report = in_process(args.path, args.repeats)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
