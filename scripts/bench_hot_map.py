"""The device tier's id -> hot slot map (embeddings/hot_map.py): cost of mapping one mini-batch's
lookups, dense int32 map against the hashed one (and binary search in the sorted hot ids, the
other sparse candidate), and their bytes.

    python scripts/bench_hot_map.py                      # Terabyte: 26 x 10M rows, 16M hot
    python scripts/bench_hot_map.py --rows 1300000 --hot 2800000   # Kaggle-sized (33.8M rows)

One mini-batch = `--batch` inputs x 26 lookups, half of them hot rows and half uniform over
every row (mostly cold), table-major as `map_lookups` gets them. Rounds alternate the forms in
one process (`map_lookups`, the step's whole mapping pass, for dense and hashed; the bare
lookups for binary search); medians and spreads in ms per mini-batch, JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from embeddings.hot_map import HotRowMap  # noqa: E402
from embeddings.staged.lookup_map import map_lookups  # noqa: E402
from perfmodel.hardware import cpu_flags  # noqa: E402


@numba.njit(cache=True)
def _binary_search(keys, q, out):
    n = keys.size
    for i in range(q.size):
        g, lo, hi = q[i], 0, n
        while lo < hi:
            m = (lo + hi) >> 1
            if keys[m] < g:
                lo = m + 1
            else:
                hi = m
        out[i] = lo if lo < n and keys[lo] == g else -1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=10_000_000, help="rows per table")
    p.add_argument("--hot", type=int, default=16_000_000, help="hot rows in all")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    T, n = args.tables, args.rows
    total = T * n
    hot = torch.from_numpy(np.unique(rng.integers(0, total, args.hot)))  # ~args.hot distinct
    base = torch.arange(T, dtype=torch.int64) * n
    maps = {"dense": HotRowMap(hot, base, total, dense=True),
            "hashed": HotRowMap(hot, base, total, dense=False)}  # fmt: skip
    sizes, row_base = np.full(T, n, np.int64), base.numpy()
    lengths = np.ones(T * args.batch, np.int64)
    per = {k: [] for k in ("dense", "hashed", "binary_search")}
    for r in range(args.rounds + 1):  # round 0 compiles and warms
        g = np.concatenate([hot.numpy()[rng.integers(0, hot.numel(), T * args.batch // 2)],
                            rng.integers(0, total, T * args.batch - T * args.batch // 2)])  # fmt: skip
        table = np.sort(rng.integers(0, T, g.size))  # table-major: a row of each table
        values = g % n
        gids = values + row_base[table]
        for name in per:
            t0 = time.perf_counter()
            if name == "binary_search":
                _binary_search(hot.numpy(), gids, np.empty(gids.size, np.int64))
            else:
                m = map_lookups(values, lengths, args.batch, sizes, row_base, maps[name])
            if r:
                per[name].append((time.perf_counter() - t0) * 1e3)
        ref = maps["dense"].slots(torch.from_numpy(gids))
        assert torch.equal(ref, maps["hashed"].slots(torch.from_numpy(gids)))
        assert m.slots.size == gids.size
    out = {
        "setup": {"tables": T, "rows_per_table": n, "hot_rows": hot.numel(), "batch": args.batch,
                  "lookups_per_batch": T * args.batch, "rounds": args.rounds,
                  "cpus": os.cpu_count(), "cpu_flags": cpu_flags(),
                  "load": [round(x, 2) for x in os.getloadavg()]},
        "ms_per_batch": {k: {"median": round(float(np.median(v)), 2),
                             "min": round(min(v), 2), "max": round(max(v), 2)}
                         for k, v in per.items()},
        "bytes": {"dense": maps["dense"].nbytes(), "hashed": maps["hashed"].nbytes(),
                  "hot_gids (all forms)": hot.numel() * 8},
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
