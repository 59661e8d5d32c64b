"""Benchmark of the Criteo pipeline; prints one JSON object.

    python scripts/bench_preprocess.py [--size-gb 1.0] [--workdir DIR] [--keep] [--workers N]

1. writes a synthetic Kaggle-layout train.txt of at least --size-gb (reused if already in
   --workdir with the same size), timing the writer;
2. preprocesses it end to end with `python -m data_pipeline preprocess` (process start, line
   count, parse, encode, write, fsync) in hash mode (--max-ind-range 10000000) and in frequency
   mode (threshold 1): raw MB/s, and the peak RSS of any process involved;
3. reads the hash-mode result back through CriteoBatchSource from the page cache for each
   --data-randomize order: samples/s;
4. baselines in the same run: a reference-style per-line Python parse (split / int()) on a
   sample of the file, and a per-sample Python batch assembly (Dataset + collate style).

The machine's load average is included: other work on a 2-core machine moves these numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_pipeline.criteo import CriteoBatchSource  # noqa: E402
from data_pipeline.synthetic_raw import SyntheticSpec, write_raw_file  # noqa: E402
from hybrid_dlrm.common import quick  # noqa: E402

BYTES_PER_LINE = 235  # a little under what the synthetic (and the real) lines take


def _generate(
    workdir: Path, size_gb: float, bytes_per_line: float = BYTES_PER_LINE
) -> tuple[Path, dict]:
    lines = int(size_gb * 1e9 / bytes_per_line) + 1
    path = workdir / f"train_{lines}.txt"
    if path.is_file() and path.stat().st_size >= size_gb * 1e9:
        return path, {"reused": True}
    started = time.perf_counter()
    info = write_raw_file(path, lines, SyntheticSpec(seed=1, vocab_cap=2_000_000))
    seconds = time.perf_counter() - started
    if info.bytes < size_gb * 1e9:  # lines came out shorter than expected: more of them
        path.unlink()
        return _generate(workdir, size_gb, 0.99 * info.bytes / lines)
    return path, {"seconds": round(seconds, 2), "mb_per_s": round(info.bytes / seconds / 1e6, 1)}


def _preprocess(raw: Path, out: Path, flags: list[str], workers: int | None) -> dict:
    """End to end through the CLI, in a fresh process (as a user runs it)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "data_pipeline", "preprocess", "--dataset", "kaggle",
           "--raw", str(raw), "--out", str(out), "--no-progress", *flags]  # fmt: skip
    if workers is not None:
        cmd += ["--workers", str(workers)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "mb_per_s": round(raw.stat().st_size / seconds / 1e6, 1)}


def _baseline_parse(raw: Path, sample_bytes: int = 20 << 20) -> dict:
    """The reference's approach: Python per line (on a sample)."""
    with open(raw, "rb") as f:
        data = f.read(sample_bytes)
    data = data[: data.rfind(b"\n") + 1]
    started = time.perf_counter()
    rows = []
    for line in data.decode().split("\n")[:-1]:
        f = line.split("\t")
        rows.append(
            (
                int(f[0]),
                [int(x or 0) for x in f[1:14]],
                [int(x or "0", 16) % 10_000_000 for x in f[14:]],
            )
        )
    seconds = time.perf_counter() - started
    return {"sample_mb": round(len(data) / 1e6, 1), "mb_per_s": round(len(data) / seconds / 1e6, 1)}


def _loader(out: Path, randomize: str, batch_size: int, seconds: float) -> float:
    source = CriteoBatchSource(out, "train", batch_size, randomize=randomize, seed=1)
    # Steady state: map every page of the memory-mapped columns first (one byte per 4 KB page),
    # as a long training run has after its first pass; else shuffled reads measure page faults.
    for part, _, _ in source._segments:
        for column in source.dataset.columns(part):
            if column is not None:
                int(np.asarray(column).reshape(-1).view(np.uint8)[::4096].sum())
    batches = source.batches(epoch=0)
    next(batches)  # thread start-up and first shuffle window
    samples = 0
    started = time.perf_counter()
    for batch in batches:
        samples += len(batch.labels)
        if time.perf_counter() - started > seconds:
            break
    batches.close()
    return samples / (time.perf_counter() - started)


def _baseline_loader(out: Path, batch_size: int, batches: int) -> float:
    """Per-sample Python assembly of shuffled batches (Dataset.__getitem__ + collate)."""
    import torch

    source = CriteoBatchSource(out, "train", batch_size, randomize="total", seed=1)
    lab, den, spa = source.dataset.columns("day_0")
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for _ in range(batches):
        items = [(den[i], spa[i], lab[i]) for i in rng.integers(0, len(den), batch_size)]
        torch.tensor(np.stack([x[0] for x in items]))
        torch.tensor(np.stack([x[1] for x in items]).T.reshape(-1).astype(np.int64))
        torch.tensor([float(x[2]) for x in items])
    return batches * batch_size / (time.perf_counter() - started)


def walk_sizes(args: argparse.Namespace, prog: str) -> None:
    """HYBRID_DLRM_QUICK (hybrid_dlrm/common/quick.py): the docs' walk runs this at its sizes."""
    args.baseline_batches = 20  # batches of the per-sample Python loader
    if quick.active():
        args.size_gb = quick.cap_scale("--size-gb", args.size_gb)
        args.loader_seconds = quick.cap_scale("--loader-seconds", args.loader_seconds)
        args.baseline_batches = quick.cap("baseline loader batches", args.baseline_batches)
        quick.announce(prog)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-gb", type=float, default=1.0, help="raw file size (>= 1 for the target)")
    p.add_argument("--workdir", type=Path, help="where to write (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--workers", type=int, help="preprocessing processes (default: automatic)")
    p.add_argument("--skip-frequency", action="store_true", help="only the hash mode")
    p.add_argument("--loader-seconds", type=float, default=3.0)
    args = p.parse_args()
    walk_sizes(args, p.prog)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_criteo_"))
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "cpus": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        raw, result["generate"] = _generate(workdir, args.size_gb)
        result["raw_bytes"] = raw.stat().st_size
        result["baseline_python_parse"] = _baseline_parse(raw)
        result["preprocess_hash"] = _preprocess(
            raw, workdir / "out_hash", ["--max-ind-range", "10000000"], args.workers
        )
        if not args.skip_frequency:
            result["preprocess_frequency"] = _preprocess(
                raw, workdir / "out_freq", ["--frequency-threshold", "1"], args.workers
            )
        # ru_maxrss of children: the largest preprocessing process (main or worker), in KB
        result["preprocess_peak_rss_mb"] = round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        )
        result["loader_samples_per_s"] = {
            f"{randomize}/{bs}": round(
                _loader(workdir / "out_hash", randomize, bs, args.loader_seconds)
            )
            for randomize in ("none", "day", "total")
            for bs in (2048, 8192)
        }
        result["baseline_python_loader_samples_per_s"] = round(
            _baseline_loader(workdir / "out_hash", 2048, args.baseline_batches)
        )
        result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
