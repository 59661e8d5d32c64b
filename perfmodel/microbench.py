"""`python -m perfmodel microbench`: every kernel sweep (`perfmodel.sweeps`) into
OUT/kernels-<sweep>.jsonl, then the fit configurations' traces (`perfmodel.fit_traces`) into
OUT/traces/, and a summary in OUT/microbench.json."""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from pathlib import Path

import torch

from perfmodel import hardware
from perfmodel import sweeps as kernel_sweeps
from perfmodel.errors import TraceError
from perfmodel.fit_traces import fit_traces
from perfmodel.graph import CTX_FIELDS

log = logging.getLogger(__name__)


def run(out_dir: str | Path, scale: float = 1.0, reps: int = 5, seed: int = 0, sweeps: list[str] | None = None,
        fit_configs: bool = True, device: str | None = None, fit_count: int | None = None) -> dict:  # fmt: skip
    """Each sweep into OUT/kernels-<sweep>.jsonl, the fit configurations' traces into OUT/traces/.
    The sweeps run on `device` (default: CUDA when available, as the trainer does)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kernel_sweeps.DEVICE = device
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from dlrm.trainer import set_flush_denormal

    set_flush_denormal(True)  # the kernels as the trainer runs them
    hw = hardware.describe()
    rng = random.Random(seed)
    threads = torch.get_num_threads()
    summary: dict = {"hardware": hw["key"], "device": str(device), "sweeps": {}, "threads": threads}
    names = sweeps or list(kernel_sweeps.SWEEPS)
    _say(f"microbench: {len(names)} kernel sweeps ({', '.join(names)})"
         + (", then the fit traces" if fit_configs else "")
         + f" into {out_dir} (--scale 1: 10-15 min on one CPU thread)")  # fmt: skip
    for i, name in enumerate(names, 1):
        t0 = time.perf_counter()
        count = max(1, int(kernel_sweeps.DEFAULT_COUNTS[name] * scale))
        gate = kernel_sweeps._GATE = hardware.SteadyGate(hw)
        try:
            recs = kernel_sweeps.SWEEPS[name](rng, count, reps)
        finally:
            kernel_sweeps._GATE = None
        torch.set_num_threads(threads)
        with open(
            out_dir / f"kernels-{name}.jsonl", "w"
        ) as f:  # one file per sweep: rerun one alone
            for r in recs:
                r["sweep"] = name
                r["ctx"] = {k: v for k, v in r.get("ctx", {}).items() if k in CTX_FIELDS}
                f.write(json.dumps(r) + "\n")
        seconds = time.perf_counter() - t0
        summary["sweeps"][name] = {
            "records": len(recs),
            "seconds": round(seconds, 1),
            **gate.summary(),
        }
        log.info("microbench %s: %d kernel records in %.1f s (canary per draw: %s)", name, len(recs), seconds,
                 gate.summary())  # fmt: skip
        _say(f"microbench: sweep {i}/{len(names)} {name}: {len(recs)} records in {seconds:.1f} s")
    if fit_configs:
        summary["fit_trace_slowdowns"] = fit_traces(out_dir / "traces", threads, fit_count)
    (out_dir / "microbench.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _say(line: str) -> None:
    """A progress line on stderr (stdout is the JSON summary): minutes of sweeps, not silence."""
    print(line, file=sys.stderr, flush=True)


def read_records(path: str | Path) -> list[dict]:
    recs = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if line:
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    raise TraceError(f"{path}:{i}: not a JSON kernel record") from None
    return recs
