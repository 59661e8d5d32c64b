"""The unique-row sparse update of the PyTorch embedding path against `index_add_` with alpha.

Prints one JSON object: for each (table rows, updated rows) the median microseconds of
`weight.index_add_(0, rows, grad, alpha=-lr)` and of `embeddings.torch_tbe.add_unique_rows` (gather,
add_ with alpha, index_copy_), measured alternately in the same process, and whether both give
bit-identical weights.

    python scripts/bench_sparse_update.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from embeddings.torch_tbe import add_unique_rows
from hybrid_dlrm.common import quick

# (table rows, updated rows): the cases measured
CASES = ((32_768, 2_377), (32_768, 8_315), (1_000_000, 8_315), (1_000_000, 65_536))


def walk_sizes(args: argparse.Namespace, prog: str) -> None:
    """HYBRID_DLRM_QUICK (hybrid_dlrm/common/quick.py): the docs' walk runs this at its sizes."""
    args.cases = CASES
    if quick.active():
        args.reps = quick.cap("--reps", args.reps)
        rows = quick.cap_sizes(
            "the cases' table", tuple(t for t, _ in CASES), like="--arch-embedding-size"
        )
        args.cases = tuple((t, min(u, t)) for t, (_, u) in zip(rows, CASES))
        quick.announce(prog)


def _median_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--dim", type=int, default=16)
    args = p.parse_args()
    walk_sizes(args, p.prog)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = {"threads": torch.get_num_threads(), "dim": args.dim, "cases": []}
    gen = torch.Generator().manual_seed(0)
    for table_rows, updated in args.cases:
        weight = torch.randn(table_rows, args.dim, generator=gen)
        rows = torch.randperm(table_rows, generator=gen)[:updated]
        grad = torch.randn(updated, args.dim, generator=gen)
        a, b = weight.clone(), weight.clone()
        a.index_add_(0, rows, grad, alpha=-0.05)
        add_unique_rows(b, rows, grad, -0.05)
        old, new = [], []
        for _ in range(3):  # alternate: slow drifts of a shared machine hit both
            old.append(
                _median_us(
                    lambda w=weight, r=rows, g=grad: w.index_add_(0, r, g, alpha=-0.05), args.reps
                )
            )
            new.append(
                _median_us(
                    lambda w=weight, r=rows, g=grad: add_unique_rows(w, r, g, -0.05), args.reps
                )
            )
        o, n = statistics.median(old), statistics.median(new)
        out["cases"].append({"table_rows": table_rows, "updated_rows": updated,
                             "index_add_alpha_us": round(o, 1), "gather_add_copy_us": round(n, 1),
                             "speedup": round(o / n, 2), "bit_identical": bool(torch.equal(a, b))})  # fmt: skip
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
