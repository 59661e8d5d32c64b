"""What checkpoint verification costs: times loading a checkpoint with and without checking its
checksums, and computing them when saving. Prints JSON.

    python scripts/bench_checkpoint.py RUN_DIR/checkpoints/step_000000004.pt [--repeats 3]

The baseline is torch.load alone (weights_only=True), what `load` did before checksums; the
verification and the checksums a save computes are timed apart on the loaded contents, the
minimum of the repeats reported.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dlrm import checkpoint as ckpt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", type=Path)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    loads, verifies, hashing = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        data = torch.load(args.path, map_location="cpu", weights_only=True)
        loads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ckpt._verify(data, args.path)  # what `load` adds to torch.load
        verifies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ckpt.checksums(data)  # what `save` adds to torch.save
        hashing.append(time.perf_counter() - t0)
        del data
    print(json.dumps({
        "file_bytes": args.path.stat().st_size,
        "threads": ckpt._THREADS,
        "torch_load_s": min(loads),
        "verify_s": min(verifies),
        "checksums_on_save_s": min(hashing),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
