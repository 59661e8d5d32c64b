"""HYBRID_DLRM_QUICK=1: every command runs at walk sizes, so the docs' walk
(scripts/docs_walk.py, tests/test_docs_walk.py) runs each page's commands as written in minutes.

The one place the variable is read. Unset (or empty, or 0) nothing changes: a user's run is the
run they asked for. Set, each command shortens what it was asked for to at most the size below,
says so in one line on stderr (`cap` records, `announce` says), and otherwise runs as usual: the
same code, the same files, the same messages, on less data.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "HYBRID_DLRM_QUICK"

# the walk's sizes: what a command asked for is cut to these (0 asked: "all", cut too)
SIZES = {
    "--num-batches": 8,  # training steps per epoch
    "--nepochs": 1,
    # a step's work: MLPerf's DCNv2 at its 2,048 took 4 s a step on two cores
    "--mini-batch-size": 512,
    "--test-data-size": 2048,  # synthetic test samples (MLPerf DCNv2's evaluation: 6.6 s at 4,096)
    "--hotline-learn-batches": 4,  # steps learning the popular rows, fewer than the run's
    # rows per table: Kaggle's full tables (33M rows, a 2 GiB checkpoint) take longer to
    # initialise and write than the walk's 8 steps take to train
    "--arch-embedding-size": 100_000,
    "--max-ind-range": 20_000,  # hash mode's rows per table (Terabyte's 10M: 62 GiB at dim 64)
    "--synthetic-table-scale": 0.01,  # the default's tables (21.6 MB)
    "--lines": 4000,  # raw Kaggle/Terabyte lines written by data_pipeline synth
    "--test-lines": 1000,
    "--users": 300,  # Taobao users written by data_pipeline synth
    "--scale": 0.05,  # perfmodel microbench: shapes swept, a share of the full sweep
    "--reps": 1,
    "--steps": 3,  # perfmodel report: timed steps per held-out configuration
    "--passes": 1,
    "fit traces": 4,  # perfmodel microbench: the first of its 15 fit configurations' traces
    "--batches": 2,  # serving.quantize: calibration batches (its precision search runs each)
    # seconds of a performance model's calibration (perfmodel/calibration.py: 25 s by default),
    # which `--placement auto` and `perfmodel predict` start on a machine without a model
    "calibration seconds": 5,
    # scripts/bench_vs_torchrec.py: Kaggle tables' scale, DCN rows per table, one batch size
    # (MLPerf's DCNv2 at 512: half a second a step); its seconds and rounds are the benchmarks'
    "--table-scale": 0.001,
    "--dcn-rows": 1000,
    "--batch-sizes": 128,
    # the benchmarks the pages show (scripts/bench_*.py), each a few seconds after its imports
    "--size-gb": 0.002,  # bench_preprocess: the generated raw file (about 8,500 lines)
    "--loader-seconds": 0.1,  # bench_preprocess: each of its 6 loader measurements
    "baseline loader batches": 2,  # bench_preprocess: its per-sample Python loader's
    "--seeds": 1,  # training seeds a benchmark repeats its runs with: the first
    # a benchmark's measurements: seconds each, interleaved rounds; 0.02 s is bench_train's
    # fewest steps (5) at any batch size
    "--seconds": 0.02,
    "--rounds": 1,
    # bench_train: the steps of data a variant's trainer gets (fewer than 1,000: `--compile`
    # auto leaves bf16 eager, as in any short run: a cold compile is 20-70 s)
    "steps of data per variant": 64,
    "generator samples": 20_000,  # bench_train: the synthetic generator timed alone
    "--train-samples": 4096,  # training samples of a benchmark's runs: 8 batches of 512
    "--profile-samples": 8192,  # inputs an access profile counts (bench_placement)
    "--interleave-steps": 8,  # steps of two placements alternated one by one
    # bench_slipstream: steps before anything is skipped, between snapshots; evaluations per
    # epoch; the drift thresholds of its curve (the first)
    "--warmup": 2,
    "--interval": 2,
    "--evals-per-epoch": 2,
    "--curve": 1,
    # bench_scm: the kaggle case's DRAM for rows and its hot part, the walk's Kaggle tables
    # (21.6 MB) 5x larger, as Kaggle's 2.2 GB against the default 512 MB
    "--dram": 4 << 20,
    "--hot-budget": 2 << 20,
    # bench_scm contention/threads: 26 tables of 20,000 rows (33 MB), a 1 MB hot part and cache
    "--ct-rows": 20_000,
    "--ct-hot": 1 << 20,
    "--ct-cache": 1 << 20,
    "--serve-cache": 1 << 20,  # bench_scm serve: the tier's row cache
    # bench_scm terabyte: 26 tables of 100,000 rows at dim 64 (666 MB, a sparse file), 34 MB
    # of it for rows
    "--tb-dram": 48 << 20,
}

_said: list[str] = []


def active() -> bool:
    return os.environ.get(VARIABLE, "").strip() not in ("", "0")


def cap(flag: str, value: int, like: str | None = None) -> int:
    """`value` (0: all), or the walk's size for `flag` (for `like` where given: a flag of
    another name that means the same) where that is smaller and the variable set; a cut is
    remembered for `announce`."""
    if not active():
        return value
    limit = SIZES[like or flag]
    if value and value <= limit:
        return value
    _said.append(f"{flag} {value or 'all'} -> {limit}")
    return limit


def cap_scale(flag: str, value: float, like: str | None = None) -> float:
    """`cap` for a fraction (or any size not a whole number: seconds, gigabytes)."""
    limit = SIZES[like or flag]
    if not active() or value <= limit:
        return value
    _said.append(f"{flag} {value:g} -> {limit:g}")
    return limit


def cap_sizes(
    flag: str, values: tuple[int, ...] | None, like: str | None = None
) -> tuple[int, ...] | None:
    """`cap` for each of a list (rows per table), one line for the list."""
    limit = SIZES[like or flag]
    if not active() or values is None or max(values) <= limit:
        return values
    _said.append(f"{flag} rows -> at most {limit:,}")
    return tuple(min(v, limit) for v in values)


def limit(name: str, value: float) -> float:
    """`value`, or at most the walk's size `name` where the variable is set, unsaid: for a
    budget that its own step names when it starts (the calibration's "about N s")."""
    return min(value, SIZES[name]) if active() else value


def note(change: str) -> None:
    """A cut that is no size (perfmodel report's `--quick`), said with the others."""
    _said.append(change)


def announce(prog: str, stream=None) -> None:
    """One line on stderr naming what was cut (nothing when nothing was)."""
    if _said:
        out = sys.stderr if stream is None else stream
        out.write(f"{prog}: {VARIABLE} is set: {', '.join(_said)} (walk sizes, not a real run)\n")
        out.flush()
        _said.clear()
