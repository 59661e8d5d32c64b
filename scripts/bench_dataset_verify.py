"""What checking a preprocessed part on its first open costs, per GB. Prints JSON.

    python scripts/bench_dataset_verify.py [--rows 10000000] [--rounds 3] [--dir /tmp]
    python scripts/bench_dataset_verify.py --train-rounds 5 [--steps 300]

Writes a Kaggle-shaped sparse column (int32 [rows, 26], ids within Kaggle's table sizes; 1.04 GB
at 10M rows) and times, in interleaved rounds from the page cache, what `CriteoDataset._verify`
does: the column's CRC-32 (`data_crc32`) and the id check (`first_id_outside`), each against the
implementation before (read() copies and zlib's CRC-32; a comparison per bound). Reports the
medians and ranges in seconds per GB. The file is deleted at the end.

`--train-rounds R` instead trains a small model on a preprocessed synthetic Kaggle-shaped data set
(7 x 30,000 lines) for `--steps` steps, alternately as it is and with the first-open check patched
out, R rounds in one process, and reports what verification adds to a training step: how often
the check ran (once per part, whatever the number of steps), the seconds it took, and the median
time from one step's start to the next's (data included), first step apart (it waits for the
first open).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from data_pipeline.npy_stream import data_crc32, first_id_outside, read_header
from data_pipeline.synthetic import KAGGLE_TABLE_SIZES


def crc_before(path: Path, chunk_bytes: int = 1 << 24) -> int:
    _, _, offset = read_header(path)
    crc = 0
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(chunk_bytes):
            crc = zlib.crc32(chunk, crc)
    return crc


def ids_before(sparse: np.ndarray, sizes: np.ndarray) -> bool:
    step = max(1, (1 << 24) // (sparse.shape[1] * sparse.itemsize))
    for start in range(0, sparse.shape[0], step):
        chunk = np.asarray(sparse[start : start + step])
        if ((chunk < 0) | (chunk >= sizes)).any():
            return True
    return False


def train_rounds(rounds: int, steps: int, directory: str) -> dict:
    from data_pipeline.criteo import CriteoDataset, PreprocessOptions, preprocess
    from data_pipeline.synthetic_raw import SyntheticSpec, write_kaggle
    from dlrm import TrainConfig, Trainer
    from dlrm.pipelines.base import StepHook

    class StepClock(StepHook):
        def __init__(self) -> None:
            self.starts: list[float] = []

        def step(self, batch, run):
            self.starts.append(time.perf_counter())
            return run()

    real_verify = CriteoDataset._verify
    calls: list[float] = []

    def timed_verify(self, part, sparse):
        t0 = time.perf_counter()
        real_verify(self, part, sparse)
        calls.append(time.perf_counter() - t0)

    Path(directory).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        write_kaggle(Path(tmp) / "raw", 7 * 30_000, 0, SyntheticSpec(seed=1, vocab_cap=20_000))
        data = preprocess("kaggle", Path(tmp) / "raw", Path(tmp) / "data",
                          PreprocessOptions(max_ind_range=20_000, progress=False))  # fmt: skip
        runs: dict[str, list[dict]] = {"verified": [], "unverified": []}
        for r in range(rounds):
            for mode in runs:
                CriteoDataset._verify = timed_verify if mode == "verified" else lambda *a: None
                calls.clear()
                clock = StepClock()
                cfg = TrainConfig(data_set="kaggle", processed_data_file=str(data),
                                  num_batches=steps, mini_batch_size=512, arch_sparse_feature_size=16,
                                  test_mini_batch_size=4096, progress=False,
                                  out_dir=str(Path(tmp) / f"run-{mode}-{r}"))  # fmt: skip
                Trainer(cfg, step_hook=clock, checkpoints=False).fit()
                gaps = np.diff(clock.starts)
                runs[mode].append({"first_step_s": float(gaps[0]),
                                   "step_s": float(np.median(gaps[1:])),
                                   "checks": len(calls), "check_s": sum(calls)})  # fmt: skip
        CriteoDataset._verify = real_verify

    def med(mode: str, key: str) -> float:
        return round(statistics.median(x[key] for x in runs[mode]), 5)

    paired = sorted(
        v["step_s"] / u["step_s"] - 1 for v, u in zip(runs["verified"], runs["unverified"])
    )
    return {
        "rounds": rounds, "steps": steps, "load_avg": os.getloadavg(),
        **{m: {k: med(m, k) for k in runs[m][0]} for m in runs},
        "step_time_added_share_paired": {"median": round(paired[len(paired) // 2], 4),
                                         "min": round(paired[0], 4), "max": round(paired[-1], 4)},
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--train-rounds", type=int, default=0)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    if args.train_rounds:
        print(json.dumps(train_rounds(args.train_rounds, args.steps, args.dir), indent=2))
        return
    sizes = np.asarray(KAGGLE_TABLE_SIZES)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    path = Path(args.dir) / f"bench_verify_{os.getpid()}.npy"
    rng = np.random.default_rng(0)
    out = np.lib.format.open_memmap(path, "w+", np.int32, (args.rows, len(sizes)))
    for s in range(0, args.rows, 1 << 20):
        rows = min(1 << 20, args.rows - s)
        out[s : s + rows] = (rng.random((rows, len(sizes))) * sizes).astype(np.int32)
    out.flush()
    del out
    gb = path.stat().st_size / 1e9
    try:
        sparse = np.load(path, mmap_mode="r", allow_pickle=False)
        cases = {
            "crc_now": lambda: data_crc32(path),
            "crc_before": lambda: crc_before(path),
            "ids_now": lambda: first_id_outside(sparse, sizes),
            "ids_before": lambda: ids_before(sparse, sizes),
        }
        assert cases["crc_now"]() == cases["crc_before"]()  # also warms the page cache
        assert cases["ids_now"]() is None and not cases["ids_before"]()
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) / gb)
    finally:
        path.unlink()
    report = {
        "file_gb": round(gb, 3),
        "rounds": args.rounds,
        "load_avg": os.getloadavg(),
        "s_per_gb": {
            k: {
                "median": round(statistics.median(v), 3),
                "min": round(min(v), 3),
                "max": round(max(v), 3),
            }  # fmt: skip
            for k, v in times.items()
        },
    }
    now = report["s_per_gb"]["crc_now"]["median"] + report["s_per_gb"]["ids_now"]["median"]
    before = report["s_per_gb"]["crc_before"]["median"] + report["s_per_gb"]["ids_before"]["median"]
    report["sparse_column_s_per_gb"] = {"now": round(now, 3), "before": round(before, 3)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
