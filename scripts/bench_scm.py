"""SSD tier benchmark (--placement tiered): the disk, training against all-in-memory, the row cache
against a block cache, and a Terabyte-sized table set.

    python scripts/bench_scm.py disk     --dir /tmp/scm-bench   # random 4 KiB reads, QD 1..64
    python scripts/bench_scm.py kaggle   --dir /tmp/scm-bench   # tiered vs device, interleaved
    python scripts/bench_scm.py contention --dir /tmp/scm-bench # the step's wait on the tier
    python scripts/bench_scm.py threads  --dir /tmp/scm-bench   # CPU per thread per step
    python scripts/bench_scm.py switch   --dir /tmp/scm-bench   # GIL switch interval, 5 vs 0.2 ms
    python scripts/bench_scm.py caches   --dir /tmp/scm-bench   # row vs block cache, equal bytes
    python scripts/bench_scm.py layout   --dir /tmp/scm-bench   # the file's layout: blocks read
    python scripts/bench_scm.py serve    --dir /tmp/scm-bench   # predictor latency from the tier
    python scripts/bench_scm.py terabyte --dir /tmp/scm-bench   # 26 x 10M rows x dim 64

Each prints one JSON object (load averages and the CPU's bf16/AMX flags included). The tier's
files live in `--dir` and are deleted at the end (`--keep` keeps them). Reads bypass the page
cache (O_DIRECT) unless `--scm-io buffered`.

- `disk`: a file of `--file-gb` of random bytes; for each queue depth d, d threads issue random
  aligned 4 KiB `os.preadv` calls with O_DIRECT (the tier's own read path) for `--seconds`:
  reads/s and latency p50/p99.
- `kaggle`: the full Kaggle tables (33.8M rows, dim 16, SGD: 2.2 GB of rows), Zipf 1.05, batch
  2048; `--placement device --embedding-init hashed` (every row in memory) against `--placement
  tiered` with `--hot-budget` + `--scm-cache` = `--dram` (default 256MB + 256MB = 512 MB of rows,
  the tables 4.2x larger). Both trainers are built in this process, the profile is taken from
  inputs neither trains on; then `--rounds` rounds of `--round-steps` steps of each, alternated
  (medians and spreads of samples/s), then both evaluated on the same test set (same AUC: the
  same computation). The tier's counters (hit rate, read amplification, I/O latency, queue
  depth, exposed I/O per step), the CPU ms per step by thread of each run, and the DRAM the
  tier's bookkeeping takes are reported. `--shapes dcnv2`: the same comparison on MLPerf's
  DLRM-DCNv2 (dim 128, its multi-hot bags of 214 ids a sample, Adagrad, its 26 tables capped at
  `--dcn-rows`; a profile of its own: use a fresh `--dir`).
- `threads`: the `contention` tables (`--ct-*`), every block written, so each staging misses,
  evicts and writes dirty rows back: CPU ms per step by thread (hybrid_dlrm/common/thread_cpu.py:
  `step` the main thread, `hotline` the staging worker, `scm-io` the thread engine's I/O
  threads, `native:<name>` torch's intra-op pool, `process` all), over `--rounds` rounds of
  `--round-steps` steps, then a cProfile (thread CPU time) of the step thread: its ms per step
  in each part of the tier's code.
- `caches`: the cold rows of `--cache-steps` Kaggle mini-batches (the rows the tiered run's SSD
  tier serves) through a row cache and an LRU 4 KiB block cache of the same bytes: hit rates and
  read amplification (bytes read / bytes of rows used), with the ids as generated (row 0 the
  hottest: popular rows share blocks) and scattered by a fixed permutation per table (as the
  hashing of raw ids does).
- `layout`: `--layout-steps` Kaggle mini-batches' cold rows replayed through the row cache
  (`perfmodel.row_cache_model.replay_row_cache`, the cache's own code) with the tier file in
  row-id order and in the profile's layout (embeddings/ssd/layout.py), at 4x and 16x
  oversubscription, ids as generated and scattered: blocks read, read amplification, rows per
  block read, hit rate (counts; the first `--layout-warm-steps` not counted).
- `bound`: `--bound-steps` Kaggle mini-batches' cold rows from an empty cache at 4x and 16x, the
  last `--bound-counted` counted: rows the tier's own cache policy reads a step against the
  fewest any cache of its size could (Belady's MIN over mini-batches, perfmodel/belady.py).
- `terabyte`: 26 tables of 10M rows at dim 64 (66.6 GB of fp32 rows) train `--tb-steps` steps
  (or until `--tb-seconds` / `--tb-max-disk-gb`) in a `--tb-dram` DRAM budget, `--tb-row-share`
  of it for rows (half hot, half cache), the rest for bookkeeping, PyTorch and the pipeline; the
  cache's pages are made resident first (`--tb-touch-cache`), so the peak is that of a full
  cache. Samples/s, bytes on disk (`du`) against the file's apparent size, peak RSS against
  the budget plus the dense part, and the large structures by name.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import resource
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _shared import cpu_flags, load_average, make_profile  # noqa: E402

from data_pipeline.synthetic import KAGGLE_TABLE_SIZES, scaled_table_sizes  # noqa: E402
from dlrm import TrainConfig, Trainer  # noqa: E402
from dlrm.config import MLPERF_DCNV2_MULTI_HOT, MLPERF_DCNV2_TABLES  # noqa: E402
from dlrm.settings.placement import ScmConfig  # noqa: E402
from embeddings.hot_rows import parse_bytes  # noqa: E402
from embeddings.profile import AccessProfile  # noqa: E402
from embeddings.ssd.aio import PREAD, Aio  # noqa: E402
from embeddings.ssd.cache import BlockCache, RowCache  # noqa: E402
from embeddings.ssd.collection import profile_priority  # noqa: E402
from embeddings.ssd.file import BLOCK, PAYLOAD, aligned_blocks  # noqa: E402
from hybrid_dlrm.common import quick  # noqa: E402
from hybrid_dlrm.common.thread_cpu import ThreadCpu, per_step_ms  # noqa: E402


def _rss_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


_LOG_SHARE = ScmConfig.__dataclass_fields__["log_share"].default  # --scm-log-share's


def _setup() -> dict:
    return {"cpus": os.cpu_count(), "cpu_flags": cpu_flags(), "load_before": load_average()}


# --- 1. the disk ----------------------------------------------------------------------------------


def _reader(fd: int, blocks: int, seed: int, stop: float, lat: list[float]) -> None:
    """Random aligned 4 KiB reads until `stop`, one at a time; latencies into `lat`."""
    rng = np.random.default_rng(seed)
    view = memoryview(aligned_blocks(1).reshape(-1))
    offsets = (rng.integers(0, blocks, 1 << 16) * BLOCK).tolist()
    k = 0
    # one read at least: a thread that starts after `stop` (a short --seconds on a busy
    # machine) still has a latency to report
    while k == 0 or time.perf_counter() < stop:
        t = time.perf_counter()
        os.preadv(fd, [view], offsets[k % len(offsets)])
        lat.append(time.perf_counter() - t)
        k += 1


def bench_disk(args) -> dict:
    path = Path(args.dir) / "disk-probe.dat"
    size = int(args.file_gb * 2**30) // BLOCK * BLOCK
    t0 = time.perf_counter()
    chunk_bytes = max(BLOCK, min(size, 64 * 2**20))  # a small file: no 64 MB to draw
    chunk = np.random.default_rng(0).integers(0, 255, chunk_bytes, dtype=np.uint8).tobytes()
    if size < BLOCK:
        raise SystemExit(f"bench_scm.py: error: --file-gb {args.file_gb}: smaller than one block")
    with open(path, "wb") as f:
        for at in range(0, size, len(chunk)):  # the last chunk cut: reads stay inside the file
            f.write(chunk[: size - at])
        f.flush()
        os.fsync(f.fileno())
    os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    write_s = time.perf_counter() - t0
    blocks = size // BLOCK
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    out = {"file_gb": round(size / 2**30, 2), "write_s": round(write_s, 1), "depths": {}}
    try:
        for depth in [int(x) for x in args.depths.split(",")]:
            lat: list[list[float]] = [[] for _ in range(depth)]
            stop = time.perf_counter() + args.seconds

            threads = [
                threading.Thread(target=_reader, args=(fd, blocks, i + 17 * depth, stop, lat[i]))
                for i in range(depth)
            ]
            t1, c1 = time.perf_counter(), time.process_time()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall, cpu = time.perf_counter() - t1, time.process_time() - c1
            all_lat = np.concatenate([np.array(x) for x in lat])
            p50, p99 = np.percentile(all_lat, [50, 99]) * 1e6
            out["depths"][depth] = {
                "reads_per_s": round(all_lat.size / wall),
                "p50_us": round(float(p50), 1),
                "p99_us": round(float(p99), 1),
                "process_cpu_us_per_read": round(cpu / all_lat.size * 1e6, 1),
            }
            print(f"disk QD {depth}: {json.dumps(out['depths'][depth])}", file=sys.stderr)
        out["aio_depths"] = _disk_aio(fd, blocks, args)
    finally:
        os.close(fd)
        path.unlink()
    return out


def _disk_aio(fd: int, blocks: int, args) -> dict:
    """The same random reads through Linux AIO from one thread (the tier's `aio` engine),
    batches of 4 x depth requests with `depth` in flight."""
    aio, out = Aio.open(1024), {}
    if aio is None:
        return {"unavailable": True}
    rng = np.random.default_rng(5)
    try:
        for depth in [int(x) for x in args.depths.split(",")]:
            aio.depth, n = depth, 4 * depth
            buf = aligned_blocks(n)
            bufs = np.uint64(buf.ctypes.data) + np.arange(n, dtype=np.uint64) * np.uint64(BLOCK)
            size = np.full(n, BLOCK, dtype=np.int64)
            lats, stop = [], time.perf_counter() + args.seconds
            t1, c1 = time.perf_counter(), time.process_time()
            while not lats or time.perf_counter() < stop:  # one batch at least
                res, lat = aio.run(fd, PREAD, bufs, rng.integers(0, blocks, n) * BLOCK, size)
                if (res != BLOCK).any():
                    raise OSError(f"aio read failed: {res[res != BLOCK][:3]}")
                lats.append(lat)
            wall, cpu = time.perf_counter() - t1, time.process_time() - c1
            all_lat = np.concatenate(lats)
            p50, p99 = np.percentile(all_lat, [50, 99]) * 1e6
            out[depth] = {
                "reads_per_s": round(all_lat.size / wall),
                "p50_us": round(float(p50), 1),
                "p99_us": round(float(p99), 1),
                "process_cpu_us_per_read": round(cpu / all_lat.size * 1e6, 1),
            }
            print(f"disk aio QD {depth}: {json.dumps(out[depth])}", file=sys.stderr)
    finally:
        aio.close()
    return out


# --- 2. Kaggle: tiered against all in memory -------------------------------------------------------


def kaggle_base(args) -> TrainConfig:
    """The kaggle case's run: the Kaggle recipe's shapes, or with `--shapes dcnv2` MLPerf's
    DLRM-DCNv2 (dim 128, its multi-hot bags, Adagrad; its tables capped at `--dcn-rows`)."""
    base = TrainConfig(
        arch_embedding_size=tuple(args.tables), arch_sparse_feature_size=16,
        arch_mlp_bot=args.mlp_bot, arch_mlp_top=args.mlp_top, synthetic_zipf=args.zipf,
        data_size=args.train_samples, test_data_size=args.test_samples, mini_batch_size=args.batch,
        optimizer="sgd", learning_rate=0.1, device="cpu", seed=123, print_freq=10**9,
        progress=False, out_dir=str(Path(args.dir) / "runs" / "base"),
    )  # fmt: skip
    if args.shapes == "kaggle":
        return base
    return base.replace(
        arch_embedding_size=tuple(min(n, args.dcn_rows) for n in MLPERF_DCNV2_TABLES),
        arch_sparse_feature_size=128, arch_mlp_bot=(13, 512, 256, 128),
        arch_mlp_top=(1024, 1024, 512, 256, 1), arch_interaction_op="dcn",
        multi_hot_sizes=MLPERF_DCNV2_MULTI_HOT, optimizer="adagrad",
    )  # fmt: skip


def _profile(args, base: TrainConfig) -> Path:
    path = Path(args.dir) / "profile.npz"
    if not path.is_file():
        info = make_profile(base, args.profile_samples, path)
        print(f"profile: {json.dumps(info)}", file=sys.stderr)
    return path


def _tiered_cfg(
    args, base: TrainConfig, profile: Path, name: str = "tiered", log_share: float | None = None
) -> TrainConfig:
    dram = parse_bytes(args.dram, "--dram")
    hot = parse_bytes(args.hot_budget, "--hot-budget")
    run = Path(args.dir) / "runs" / name
    return base.replace(
        placement="tiered", hot_budget=str(hot), scm_cache=str(dram - hot),
        scm_dir=str(run / "scm"), scm_io=args.scm_io, scm_io_threads=args.io_threads,
        scm_io_engine=args.io_engine, scm_io_depth=args.io_depth,
        scm_log_share=args.log_share if log_share is None else log_share,
        profile_file=str(profile), out_dir=str(run),
    )  # fmt: skip


def bench_kaggle(args) -> dict:
    needed = args.warmup_steps + args.rounds * args.round_steps
    if -(-args.train_samples // args.batch) < needed:  # the streams would run dry mid-comparison
        raise SystemExit(
            f"bench_scm.py: error: --train-samples {args.train_samples}: fewer than the "
            f"{needed} batches of {args.batch} that --warmup-steps + --rounds x --round-steps take"
        )
    setup = _setup()  # the load before any work
    base = kaggle_base(args)
    profile = _profile(args, base)
    t0 = time.perf_counter()
    device = Trainer(
        base.replace(placement="device", embedding_init="hashed",
                            out_dir=str(Path(args.dir) / "runs" / "device")),
        checkpoints=False,
    )  # fmt: skip
    device_build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tiered = Trainer(_tiered_cfg(args, base, profile), checkpoints=False)
    tiered_build_s = time.perf_counter() - t0
    prepared = _long_run_state(args, tiered)
    runs = {"device": device, "tiered": tiered}
    if args.patched_too:  # the same DRAM, evicted rows patched into their blocks one by one
        runs["patched"] = Trainer(
            _tiered_cfg(args, base, profile, "patched", 0.0), checkpoints=False
        )
        prepared = {"tiered": prepared, "patched": _long_run_state(args, runs["patched"])}
    streams = {k: t.data.train.batches(0, 0) for k, t in runs.items()}
    rates: dict[str, list[float]] = {k: [] for k in runs}
    cpu_ms: dict[str, list[float]] = {k: [] for k in runs}  # the process's CPU per step
    thread_ms: dict[str, list[dict]] = {k: [] for k in runs}  # and by thread
    loads: list[float] = []  # 1-minute load average after each round
    steps = 0
    batch = base.mini_batch_size
    # warm-up: the tier's cache fills (its first misses are the cold start, reported apart)
    warm = {}
    for name, t in runs.items():
        t1 = time.perf_counter()
        for _ in range(args.warmup_steps):
            t.pipeline.progress(streams[name])
        warm[name] = round(args.warmup_steps * batch / (time.perf_counter() - t1), 1)
    steps += args.warmup_steps
    cold = {k: dict(runs[k].model.embeddings.counters()) for k in runs if k != "device"}
    for r in range(args.rounds):
        for name, t in runs.items():
            t1, c1 = time.perf_counter(), time.process_time()
            counter = ThreadCpu().start()
            for _ in range(args.round_steps):
                t.pipeline.progress(streams[name])
            rates[name].append(args.round_steps * batch / (time.perf_counter() - t1))
            cpu_ms[name].append((time.process_time() - c1) / args.round_steps * 1e3)
            thread_ms[name].append(per_step_ms(counter.stop(), args.round_steps))
        loads.append(load_average()[0])
        steps += args.round_steps
        print(
            f"round {r}: " + ", ".join(f"{k} {v[-1]:.0f} samples/s" for k, v in rates.items()),
            file=sys.stderr,
        )
    evals = {}
    for name, t in runs.items():
        for stream in (streams[name],):
            del stream
        evals[name] = t.evaluate()
    emb = tiered.model.embeddings
    c, info = emb.counters(), emb.placement_info()
    ratio = [b / a for a, b in zip(rates["device"], rates["tiered"])]
    patched = {}
    if args.patched_too:
        pc = runs["patched"].model.embeddings.counters()
        pr = [b / a for a, b in zip(rates["device"], rates["patched"])]
        patched = {
            "patched_over_device_per_round": [round(x, 3) for x in pr],
            "patched_over_device_median": round(float(np.median(pr)), 3),
            "tiered_over_patched_median": round(
                float(np.median([b / a for a, b in zip(rates["patched"], rates["tiered"])])), 3
            ),
            "tier_patched": {k: v for k, v in pc.items() if k.startswith("scm_")},
            "tier_patched_counters_after_warmup_only": _after_warmup(pc, cold["patched"]),
            "patched_scm_cache_bytes": runs["patched"].model.embeddings.placement_info()[
                "scm_cache_bytes"
            ],
        }
    out = {
        "setup": {
            **setup, "shapes": args.shapes, "rows": sum(base.arch_embedding_size),
            "dim": base.arch_sparse_feature_size, "optimizer": base.optimizer,
            "zipf": args.zipf, "batch": batch, "dram_for_rows": args.dram,
            "hot_budget": args.hot_budget, "log_share": args.log_share,
            "scm_io": args.scm_io, "io_threads": args.io_threads,
            "io_engine": tiered.model.embeddings.store.tier.file.engine, "io_depth": args.io_depth,
            "profile_samples": args.profile_samples, "rounds": args.rounds,
            "round_steps": args.round_steps, "warmup_steps": args.warmup_steps,
        },
        "build_s": {"device": round(device_build_s, 1), "tiered": round(tiered_build_s, 1)},
        "tier_prepared_as_a_long_run": prepared,
        "warmup_samples_per_s": warm,
        "samples_per_s": {k: [round(x) for x in v] for k, v in rates.items()},
        "samples_per_s_median": {k: round(float(np.median(v))) for k, v in rates.items()},
        "process_cpu_ms_per_step": {k: [round(x, 1) for x in v] for k, v in cpu_ms.items()},
        "thread_cpu_ms_per_step_median": {k: _median_groups(v) for k, v in thread_ms.items()},
        "load_after_each_round": loads,
        "tiered_over_device_per_round": [round(x, 3) for x in ratio],
        "tiered_over_device_median": round(float(np.median(ratio)), 3),
        "target_0_7x_met": bool(np.median(ratio) >= 0.7),
        "test_auc": {k: round(v["auc"], 6) for k, v in evals.items()},
        "same_auc_4_decimals": round(evals["device"]["auc"], 4) == round(evals["tiered"]["auc"], 4),
        "tier": {k: v for k, v in c.items() if k.startswith("scm_")},
        "tier_counters_after_warmup_only": _after_warmup(c, cold["tiered"]),
        **patched,
        "hotline": {k: c.get(k) for k in ("popular_input_share", "cold_rows_per_batch",
                                          "gather_s", "exposed_gather_s", "hidden_share")},
        "dram": {
            "hot_rows": info["hot_rows"], "device_tier_bytes": info["device_tier_bytes"],
            "scm_cache_bytes": info["scm_cache_bytes"], "scm_bookkeeping_bytes":
            info["scm_dram_bytes"] - info["scm_cache_bytes"],
            "hot_remap_bytes": 4 * sum(base.arch_embedding_size),
        },
        "peak_rss_gb_both_trainers": _rss_gb(),
        "load_after": load_average(),
    }  # fmt: skip
    d = out["tier_counters_after_warmup_only"]
    lookups = d["scm_cache_hits"] + d["scm_cache_misses"]
    out["tier_hit_rate_after_warmup"] = round(d["scm_cache_hits"] / lookups, 4) if lookups else None
    del runs, device, tiered
    gc.collect()
    return out


def _after_warmup(c: dict, cold: dict) -> dict:
    """The tier's counts over the timed rounds."""
    keys = ("scm_cache_hits", "scm_cache_misses", "scm_rows_read", "scm_bytes_read",
            "scm_writeback_bytes", "scm_writeback_read_bytes", "scm_log_rows_written",
            "scm_log_rows_read", "scm_log_rows_swept", "scm_log_sweeps")  # fmt: skip
    return {k: c[k] - cold[k] for k in keys if c.get(k) is not None and k in cold}


def _stream(source, epoch: int):
    """Mini-batches of `source` from `epoch` on, endlessly (every epoch is new data)."""
    while True:
        yield from source.batches(epoch)
        epoch += 1


def _long_run_state(args, trainer: Trainer) -> dict:
    """The tier as a long run leaves it: every block written (`--fill`: each cache miss is a
    real read) and the cache full of dirty rows (`--warm-steps` mini-batches of a later epoch,
    which the run never trains on, read through the cache and written back unchanged)."""
    coll = trainer.model.embeddings
    tier, out = coll.store.tier, {}
    if args.fill:
        t0 = time.perf_counter()
        out["blocks_filled"] = tier.fill()
        out["fill_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    for i, batch in enumerate(_stream(trainer.data.train, 1)):
        if i >= args.warm_steps:
            break
        gids = coll.global_ids(batch.sparse_features)
        cold = torch.unique(gids[coll.hot_map.slots(gids) < 0])
        tier.write_rows(cold, *tier.read_rows(cold))  # values unchanged, rows dirty
    out.update(warm_steps=args.warm_steps, warm_s=round(time.perf_counter() - t0, 1),
               cache_rows=tier.cache.used, cache_capacity=tier.cache.capacity,
               counters_before_training=tier.counters())  # fmt: skip
    print(f"tier prepared: {json.dumps(out)}", file=sys.stderr)
    return out


# --- 3. row cache vs block cache ------------------------------------------------------------------


def bench_caches(args) -> dict:
    from dlrm.data import build_data
    from embeddings.config import SparseOptimizer
    from embeddings.hot_rows import plan_placement

    base = kaggle_base(args)
    profile = AccessProfile.load(_profile(args, base))
    opt = SparseOptimizer("sgd")
    plan = plan_placement(profile, [16] * 26, opt, parse_bytes(args.hot_budget), one_home=True)
    sizes = list(args.tables)
    row_base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    hot = np.concatenate([r >= 0 for r in plan.remaps])
    cache_bytes = parse_bytes(args.dram) - parse_bytes(args.hot_budget)
    row_bytes = 16 * 4
    rpb = PAYLOAD // row_bytes
    rng = np.random.default_rng(7)
    perms = [rng.permutation(n).astype(np.int64) for n in sizes]
    data = build_data(base)
    prio = profile_priority(profile.counts, sizes)
    out = {"setup": {**_setup(), "cache_bytes": cache_bytes, "row_bytes": row_bytes,
                     "rows_per_block": rpb, "steps": args.cache_steps,
                     "counted_after_steps": args.cache_warm_steps}}  # fmt: skip
    for order in ("as_generated", "scattered"):
        total = sum(sizes)
        rows = RowCache(total, 0, cache_bytes // row_bytes, prio)
        blocks = BlockCache(cache_bytes // BLOCK)
        used = 0
        for i, batch in enumerate(_stream(data.train, 0)):
            if i >= args.cache_steps:
                break
            if i == args.cache_warm_steps:  # count the steady state only
                rows.hits = rows.misses = blocks.row_hits = blocks.row_misses = 0
                blocks.block_hits = blocks.block_misses = used = 0
            kjt = batch.sparse_features
            lengths = kjt.lengths().view(26, -1).sum(1).numpy()
            vals = kjt.values().numpy().astype(np.int64)
            gid = vals + np.repeat(row_base, lengths)
            gid = np.unique(gid[~hot[gid]])  # the SSD tier's rows of this mini-batch
            if order == "scattered":  # the same rows, their ids scattered within each table
                t = np.searchsorted(row_base, gid, side="right") - 1
                local = gid - row_base[t]
                scat = np.empty_like(gid)
                for tt in np.unique(t):
                    sel = t == tt
                    scat[sel] = perms[tt][local[sel]] + row_base[tt]
                block_ids = np.unique(scat)
            else:
                block_ids = gid
            g = torch.from_numpy(gid)
            rows.next_access()
            rows.admit(g[rows.lookup(g) < 0], dirty=False)
            blocks.access(block_ids, rpb)
            used += gid.size
        row_hit = rows.hits / (rows.hits + rows.misses)
        block_hit = blocks.row_hits / (blocks.row_hits + blocks.row_misses)
        out[order] = {
            "rows_served": used,
            "row_cache": {"hit_rate": round(row_hit, 4), "bytes_read": rows.misses * BLOCK,
                          "read_amplification": round(BLOCK / row_bytes, 1)},
            "block_cache": {"hit_rate": round(block_hit, 4),
                            "bytes_read": blocks.block_misses * BLOCK,
                            "read_amplification": round(blocks.block_misses * BLOCK / max(1, blocks.row_misses * row_bytes), 2)},
            "row_cache_hits_more": row_hit > block_hit,
        }  # fmt: skip
        out[order]["bytes_read_row_over_block"] = round(
            rows.misses * BLOCK / max(1, blocks.block_misses * BLOCK), 3
        )
        print(f"caches {order}: {json.dumps(out[order])}", file=sys.stderr)
    out["load_after"] = load_average()
    return out


# --- 3b. the tier file's layout, counted ------------------------------------------------------------


def _scattered(profile: AccessProfile, perms: list[np.ndarray]) -> AccessProfile:
    """`profile` with each table's row ids moved by its permutation (as hashing raw ids does)."""
    counts = []
    for c, p in zip(profile.counts, perms):
        moved = np.empty_like(c)
        moved[p] = c
        counts.append(moved)
    lengths = profile.sample_lengths
    parts = np.split(profile.sample_values, np.cumsum(lengths.sum(axis=1))[:-1])
    values = (
        np.concatenate([p[v] for v, p in zip(parts, perms)])
        if lengths.size
        else profile.sample_values
    )
    return AccessProfile(profile.feature_names, profile.table_sizes, counts, profile.inputs,
                         profile.sample_rate, lengths, values)  # fmt: skip


class _HotMask:
    """The device tier's rows as `warm_rows` asks for them (slot >= 0: held)."""

    def __init__(self, hot: np.ndarray) -> None:
        self.hot = hot

    def slots(self, g: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.where(self.hot[g.numpy()], 0, -1))


def bench_layout(args) -> dict:
    """The same access trace through the tier's row cache and file with the file in row-id
    order and in the profile's layout: blocks read, read amplification, rows per block read
    (counts, no timing). Kaggle's tables at 4x and 16x oversubscription (hot rows + cache =
    rows / 4 or / 16, half each), ids as generated (row 0 the hottest) and scattered by a fixed
    permutation per table (the profile scattered alike). The cache starts as a long run leaves
    it (the rows the profile ranks highest, `warm_rows`) and every block counts as written."""
    from dlrm.data import build_data
    from embeddings.config import SparseOptimizer
    from embeddings.hot_rows import plan_placement
    from embeddings.ssd.layout import layout_rows, plan_layout
    from perfmodel.row_cache_model import replay_row_cache, seen_rows, warm_rows

    base = kaggle_base(args)
    profile = AccessProfile.load(_profile(args, base))
    opt = SparseOptimizer("sgd")
    sizes = list(args.tables)
    total, row_bytes = sum(sizes), 16 * 4
    rpb = PAYLOAD // row_bytes
    row_base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    trace = []  # every lookup of each mini-batch, as global ids
    for i, batch in enumerate(_stream(build_data(base).train, 0)):
        if i >= args.layout_steps:
            break
        kjt = batch.sparse_features
        lengths = kjt.lengths().view(26, -1).sum(1).numpy()
        trace.append(kjt.values().numpy().astype(np.int64) + np.repeat(row_base, lengths))
    rng = np.random.default_rng(7)
    perms = [rng.permutation(n).astype(np.int64) for n in sizes]
    whole = np.concatenate([p + b for p, b in zip(perms, row_base)])  # global -> scattered
    out = {"setup": {**_setup(), "rows": total, "row_bytes": row_bytes, "rows_per_block": rpb,
                     "steps": args.layout_steps, "counted_from_step": args.layout_warm_steps,
                     "profile_inputs": profile.inputs, "zipf": args.zipf}}  # fmt: skip
    for order in ("as_generated", "scattered"):
        prof = profile if order == "as_generated" else _scattered(profile, perms)
        ids = trace if order == "as_generated" else [whole[g] for g in trace]
        prio = profile_priority(prof.counts, sizes)
        for over in (4, 16):
            dram = total * row_bytes // over
            hot_budget = dram // 2
            plan = plan_placement(prof, [16] * 26, opt, hot_budget, one_home=True)
            hot = np.concatenate([r >= 0 for r in plan.remaps])
            stream = [torch.from_numpy(np.unique(g[~hot[g]])) for g in ids]
            capacity = (dram - hot_budget) // row_bytes

            warm = warm_rows(seen_rows(prof.counts, sizes)[0], _HotMask(hot), capacity, 1 << 16)
            case = {"dram_for_rows": dram, "hot_rows": int(hot.sum()), "cache_rows": capacity}
            for name in ("identity", "profile"):
                layout = plan_layout(prof, plan, layout_rows(capacity * row_bytes)) if name == "profile" else None  # fmt: skip
                rep = replay_row_cache(stream, total, capacity, rpb, prio, warm=warm, layout=layout)
                w = args.layout_warm_steps
                hits, misses = sum(rep.hits_per_batch[w:]), sum(rep.misses_per_batch[w:])
                blocks, evict = sum(rep.miss_blocks[w:]), sum(rep.evict_blocks[w:])
                case[name] = {
                    "layout_rows": layout.num_placed if layout else 0,
                    "hit_rate": round(hits / max(1, hits + misses), 4),
                    "rows_read": misses, "blocks_read": blocks, "bytes_read": blocks * BLOCK,
                    "read_amplification": round(blocks * BLOCK / max(1, misses * row_bytes), 2),
                    "rows_per_block_read": round(misses / max(1, blocks), 3),
                    "writeback_blocks": evict,
                }  # fmt: skip
            case["blocks_read_profile_over_identity"] = round(
                case["profile"]["blocks_read"] / max(1, case["identity"]["blocks_read"]), 4
            )
            out[f"{order}_{over}x"] = case
            print(f"layout {order} {over}x: {json.dumps(case)}", file=sys.stderr)
    out["load_after"] = load_average()
    return out


def bench_bound(args) -> dict:
    """The fewest rows any row cache of the tier's size could read, against the tier's own
    policy, in the steady state: Kaggle's tables at 4x and 16x (as `layout`), `--bound-steps`
    mini-batches' cold rows from an empty cache, counted over the last `--bound-counted`. The
    bound is Belady's MIN over mini-batches (perfmodel/belady.py), which knows every future
    batch; the policy is the cache's own code (`replay_row_cache`, profile priorities). Counts,
    no timing: times the CPU of one read (`disk`), it is the least the tier costs a step."""
    from dlrm.data import build_data
    from embeddings.config import SparseOptimizer
    from embeddings.hot_rows import plan_placement
    from perfmodel.belady import min_misses
    from perfmodel.row_cache_model import replay_row_cache

    base = kaggle_base(args)
    profile = AccessProfile.load(_profile(args, base))
    opt = SparseOptimizer("sgd")
    sizes = list(args.tables)
    total, row_bytes = sum(sizes), 16 * 4
    row_base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    prio = profile_priority(profile.counts, sizes)
    cases = {}
    for over in (4, 16):
        dram = total * row_bytes // over
        hot_budget = dram // 2
        plan = plan_placement(profile, [16] * len(sizes), opt, hot_budget, one_home=True)
        cases[over] = (
            np.concatenate([r >= 0 for r in plan.remaps]),
            (dram - hot_budget) // row_bytes,
            dram,
        )
    streams: dict[int, list[torch.Tensor]] = {over: [] for over in cases}
    t0 = time.perf_counter()
    for i, batch in enumerate(_stream(build_data(base).train, 0)):
        if i >= args.bound_steps:
            break
        kjt = batch.sparse_features
        lengths = kjt.lengths().view(len(sizes), -1).sum(1).numpy()
        g = kjt.values().numpy().astype(np.int64) + np.repeat(row_base, lengths)
        for over, (hot, _, _) in cases.items():
            streams[over].append(torch.from_numpy(np.unique(g[~hot[g]])))
    out = {"setup": {**_setup(), "rows": total, "row_bytes": row_bytes, "steps": args.bound_steps,
                     "counted_steps": args.bound_counted, "profile_inputs": profile.inputs,
                     "zipf": args.zipf, "batch": base.mini_batch_size,
                     "trace_s": round(time.perf_counter() - t0, 1)}}  # fmt: skip
    first = args.bound_steps - args.bound_counted
    for over, (hot, capacity, dram) in cases.items():
        stream = streams[over]
        counted = stream[first:]
        lookups = sum(t.numel() for t in counted)
        rep = replay_row_cache(stream, total, capacity, PAYLOAD // row_bytes, prio)
        policy = sum(rep.misses_per_batch[first:])
        bound = min_misses(stream, capacity, counted_from=first)
        case = {
            "dram_for_rows": dram, "hot_rows": int(hot.sum()), "cache_rows": int(capacity),
            "cold_rows_per_step": round(lookups / len(counted), 1),
            "policy": {"rows_read_per_step": round(policy / len(counted), 1),
                       "hit_rate": round(1 - policy / lookups, 4),
                       "evictions": rep.evictions},
            "belady": {"rows_read_per_step": round(bound / len(counted), 1),
                       "hit_rate": round(1 - bound / lookups, 4)},
        }  # fmt: skip
        out[f"{over}x"] = case
        print(f"bound {over}x: {json.dumps(case)}", file=sys.stderr)
    out["load_after"] = load_average()
    return out


# --- 2b. the step's wait on the tier: write-backs queued or waiting for the lock ------------------


def _small_tiered(args, name: str, counted_steps: int, **extra) -> TrainConfig:
    """The `contention` and `threads` cases' run: 26 tables of `--ct-rows`, tiered with
    `--ct-hot` hot rows and a `--ct-cache` row cache, its profile made first, data for the
    warm-up and `counted_steps`, under DIR/`name`."""
    d = Path(args.dir) / name
    base = kaggle_base(args).replace(
        arch_embedding_size=(args.ct_rows,) * 26, out_dir=str(d / "base"),
        data_size=args.batch * (args.warmup_steps + counted_steps + 8),
    )  # fmt: skip
    profile = d / "profile.npz"
    d.mkdir(parents=True, exist_ok=True)
    make_profile(base, args.ct_profile_samples, profile)
    return base.replace(
        placement="tiered", hot_budget=args.ct_hot, scm_cache=args.ct_cache,
        scm_dir=str(d / "scm"), scm_io=args.scm_io, scm_io_threads=args.io_threads,
        profile_file=str(profile), out_dir=str(d / "tiered"), **extra,
    )  # fmt: skip


def bench_contention(args) -> dict:
    """Tables of `--ct-rows` rows each (26, dim 16, SGD), every block written and a small cache,
    so each staging reads, evicts and writes back: rounds of `--round-steps` steps alternate
    between write-backs that wait for the tier's lock (the first round's behaviour) and
    write-backs queued when the tier is busy. Counted per step: the step thread's time in the
    tier (wall and CPU), the time callers waited for the lock, the time steps waited for
    stagings, and the step thread's CPU time."""
    cfg = _small_tiered(args, "contention", 2 * args.rounds * args.round_steps)
    trainer = Trainer(cfg, checkpoints=False)
    coll = trainer.model.embeddings
    tier = coll.store.tier
    t0 = time.perf_counter()
    filled = tier.fill()
    fill_s = time.perf_counter() - t0
    stream = trainer.data.train.batches(0, 0)
    for _ in range(args.warmup_steps):
        trainer.pipeline.progress(stream)
    keys = ("scm_step_io_s", "scm_step_io_cpu_s", "scm_lock_wait_s", "exposed_gather_s",
            "gather_s", "scm_rows_from_recent_writes", "scm_cache_evictions", "scm_rows_read")  # fmt: skip
    per_round: dict[str, list[dict]] = {"lock": [], "queue": []}
    for r in range(args.rounds):
        for mode in ("lock", "queue"):
            tier.queue_writes = mode == "queue"
            c0, cpu0, t1 = coll.counters(), time.thread_time(), time.perf_counter()
            for _ in range(args.round_steps):
                trainer.pipeline.progress(stream)
            wall, cpu = time.perf_counter() - t1, time.thread_time() - cpu0
            c = coll.counters()
            n = args.round_steps
            row = {k: round((c[k] - c0[k]) / n, 5) for k in keys}
            row.update(step_s=round(wall / n, 4), step_thread_cpu_s=round(cpu / n, 4))
            per_round[mode].append(row)
            print(f"contention round {r} {mode}: {json.dumps(row)}", file=sys.stderr)
    tier.queue_writes = True

    def median(mode: str, k: str) -> float:
        return round(float(np.median([x[k] for x in per_round[mode]])), 5)

    fields = (*keys, "step_s", "step_thread_cpu_s")
    out = {
        "setup": {**_setup(), "tables": 26, "rows_per_table": args.ct_rows, "dim": 16,
                  "optimizer": "sgd", "hot_budget": args.ct_hot, "scm_cache": args.ct_cache,
                  "blocks_filled": filled, "fill_s": round(fill_s, 1), "rounds": args.rounds,
                  "round_steps": args.round_steps, "scm_io": args.scm_io},
        "per_step_median": {m: {k: median(m, k) for k in fields} for m in per_round},
        "per_round": per_round,
        "load_after": load_average(),
    }  # fmt: skip
    del trainer, coll, tier
    gc.collect()
    return out


# --- 2d. the CPU per thread per step, and the step thread's share in the tier -------------------


# the tier's code, as a profile of the step thread names it: (file, function) -> the part it is
_TIER_PARTS = {
    ("collection.py", "_send_home"): "write-back (hand-over)",
    ("collection.py", "_renew"): "refresh of staged rows",
    ("collection.py", "_load"): "load into the staging slots (all of it)",
    ("collection.py", "_renew_from_store"): "renewal of a staging from the tier",
    ("tier.py", "write_rows"): "tier.write_rows",
    ("tier.py", "_store_queued"): "store queued writes (cache, evictions)",
    ("tier.py", "read_rows"): "tier.read_rows (cache lookups, file reads)",
    ("tier.py", "_write_file"): "evicted rows written to the file",
    ("tier.py", "flush"): "flush (checkpoint)",
    ("tier.py", "_check"): "tier._check",
    ("writes.py", "put"): "write queue put",
}


def _step_profile(stats) -> dict:
    """Cumulative seconds of each tier part in a cProfile of the step thread (0: never called
    there)."""
    out = dict.fromkeys(_TIER_PARTS.values(), 0.0)
    for (file, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        part = _TIER_PARTS.get((Path(file).name, fn))
        if part is not None and ("embeddings/" in file):
            out[part] = out.get(part, 0.0) + ct
    return out


def _median_groups(rounds: list[dict]) -> dict[str, float]:
    """Per thread group (`step`, `hotline`, `native:...`, `process`) the median over rounds of
    CPU ms per step."""
    groups = sorted({g for r in rounds for g in r})
    return {g: round(float(np.median([r.get(g, 0.0) for r in rounds])), 2) for g in groups}


def bench_threads(args) -> dict:
    """The contention case's tables (26 of `--ct-rows` rows, dim 16, SGD; `--ct-hot` hot rows,
    a `--ct-cache` row cache, every block written first), so each staging misses, evicts and
    writes dirty rows back: `--rounds` rounds of `--round-steps` steps after `--warmup-steps`,
    each counted by thread (hybrid_dlrm/common/thread_cpu.py: /proc/self/task/*/stat), then one
    more round with a deterministic profile (cProfile) of the step thread only, to attribute the
    step thread's CPU in the tier's code."""
    import cProfile
    import pstats

    cfg = _small_tiered(args, "threads", (args.rounds + 1) * args.round_steps,
                        scm_io_engine=args.io_engine, threads=args.torch_threads)  # fmt: skip
    trainer = Trainer(cfg, checkpoints=False)
    coll = trainer.model.embeddings
    tier = coll.store.tier
    filled = tier.fill()
    stream = trainer.data.train.batches(0, 0)
    for _ in range(args.warmup_steps):
        trainer.pipeline.progress(stream)
    c0 = coll.counters()
    rounds = []
    for r in range(args.rounds):
        counter = ThreadCpu().start()
        for _ in range(args.round_steps):
            trainer.pipeline.progress(stream)
        rounds.append(per_step_ms(counter.stop(), args.round_steps))
        print(f"threads round {r}: {json.dumps(rounds[-1])}", file=sys.stderr)
    c = coll.counters()
    n = args.rounds * args.round_steps
    keys = ("scm_cache_misses", "scm_cache_evictions", "scm_rows_read", "scm_rows_initial",
            "scm_rows_written", "scm_rows_from_recent_writes")  # fmt: skip
    counts = {k: round((c[k] - c0[k]) / n, 1) for k in keys}
    prof = cProfile.Profile(time.thread_time)  # the calling thread only, its CPU time
    cpu0 = time.thread_time()
    prof.enable()
    for _ in range(args.round_steps):
        trainer.pipeline.progress(stream)
    prof.disable()
    step_cpu = time.thread_time() - cpu0
    parts = _step_profile(pstats.Stats(prof))
    out = {
        "setup": {**_setup(), "tables": 26, "rows_per_table": args.ct_rows, "dim": 16,
                  "optimizer": "sgd", "hot_budget": args.ct_hot, "scm_cache": args.ct_cache,
                  "blocks_filled": filled, "rounds": args.rounds, "round_steps": args.round_steps,
                  "warmup_steps": args.warmup_steps, "scm_io": args.scm_io,
                  "io_engine": tier.file.engine, "torch_threads": torch.get_num_threads()},
        "cpu_ms_per_step_median": _median_groups(rounds),
        "cpu_ms_per_step_per_round": rounds,
        "tier_per_step": counts,
        "step_thread_profiled": {
            "cpu_ms_per_step_under_cprofile": round(1e3 * step_cpu / args.round_steps, 2),
            "tier_parts_ms_per_step": {
                k: round(1e3 * v / args.round_steps, 3) for k, v in sorted(parts.items())
            },
        },
        "load_after": load_average(),
    }  # fmt: skip
    del trainer, coll, tier
    gc.collect()
    return out


# --- 2c. the GIL switch interval outside the tier's I/O --------------------------------------------


def bench_switch(args) -> dict:
    """A small tiered run (the tests' size: 4 tables of <= 500 rows, dim 4, Adagrad, a 2 KB cache,
    so every step evicts and reads back), rounds of `--round-steps` steps alternating the
    process's switch interval outside the tier's I/O: Python's default 5 ms (what the tier leaves
    now) against 0.2 ms (what the first round set for the whole process). Per step: wall time and
    the step thread's CPU time."""
    from dlrm.config import TrainConfig as Cfg

    steps = args.rounds * 2 * args.round_steps + args.warmup_steps + 4
    cfg = Cfg(
        arch_embedding_size=(60, 40, 500, 7), arch_sparse_feature_size=4, arch_mlp_bot=(13, 16, 4),
        arch_mlp_top=(16, 1), mini_batch_size=64, data_size=64 * steps, test_data_size=512,
        learning_rate=0.1, optimizer="adagrad", print_freq=10**9, progress=False,
        placement="tiered", hot_budget="2KB", profile_sample_rate=0.2, scm_cache="2KB",
        scm_io="buffered", device="cpu", out_dir=str(Path(args.dir) / "switch"),
    )  # fmt: skip
    torch.set_num_threads(1)
    trainer = Trainer(cfg, checkpoints=False)
    stream = trainer.data.train.batches(0, 0)
    for _ in range(args.warmup_steps):
        trainer.pipeline.progress(stream)
    before = sys.getswitchinterval()
    rows: dict[str, list[dict]] = {"5ms": [], "0.2ms": []}
    try:
        for _ in range(args.rounds):
            for name, interval in (("5ms", 5e-3), ("0.2ms", 2e-4)):
                sys.setswitchinterval(interval)
                t0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(args.round_steps):
                    trainer.pipeline.progress(stream)
                n = args.round_steps
                rows[name].append({"step_ms": round(1e3 * (time.perf_counter() - t0) / n, 2),
                                   "step_thread_cpu_ms": round(1e3 * (time.thread_time() - c0) / n, 2)})  # fmt: skip
    finally:
        sys.setswitchinterval(before)
    med = {k: {f: float(np.median([r[f] for r in v])) for f in v[0]} for k, v in rows.items()}
    return {"setup": {**_setup(), "rounds": args.rounds, "round_steps": args.round_steps},
            "per_step_median": med, "per_round": rows, "load_after": load_average()}  # fmt: skip


# --- 5. inference from the tier ------------------------------------------------------------------


def _percentiles_ms(seconds: list[float]) -> dict:
    p50, p99 = np.percentile(np.array(seconds) * 1e3, [50, 99])
    return {"p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3)}


def bench_serve(args) -> dict:
    """An int8 artifact of the Kaggle tables (33.8M rows, dim 16: 676 MB of rows) scored by the
    in-memory predictor and by one opened with `--scm-dir` and `--serve-cache` of row cache
    (O_DIRECT), requests alternated one by one: cold (a new predictor, the cache empty: its first
    `--serve-requests` requests) and warm (after `--serve-warm` requests of other inputs)."""
    from dlrm.data import build_data
    from hybrid_dlrm.serving import Predictor
    from hybrid_dlrm.serving.quantize import main as quantize

    d = Path(args.dir) / "serve"
    d.mkdir(parents=True, exist_ok=True)
    base = kaggle_base(args).replace(
        placement="device", embedding_init="hashed", data_size=args.batch * 20,
        test_data_size=args.batch, out_dir=str(d / "run"), save_model=str(d / "model.pt"),
    )  # fmt: skip
    t0 = time.perf_counter()
    art = d / "artifact"
    if not (art / "manifest.json").is_file():  # made once (kept with --keep)
        trainer = Trainer(base, checkpoints=False)
        trainer.fit()
        del trainer
        gc.collect()
        with contextlib.redirect_stdout(sys.stderr):  # stdout is this script's JSON alone
            done = quantize([str(d / "model.pt"), "--out", str(art), "--emb-precision", "int8"])
        if done != 0:
            raise SystemExit("bench_scm serve: quantize failed")
        (d / "model.pt").unlink()
    made_s = time.perf_counter() - t0
    out = {"setup": {**_setup(), "rows": sum(args.tables), "dim": 16, "precision": "int8",
                     "table_bytes": sum(args.tables) * 20, "cache": args.serve_cache,
                     "requests": args.serve_requests, "warm_requests": args.serve_warm,
                     "scm_io": args.scm_io, "artifact_made_s": round(made_s, 1)}}  # fmt: skip
    memory = Predictor.load(art)
    for batch in (1, 64):
        data = build_data(base.replace(
            mini_batch_size=batch,
            data_size=batch * (args.serve_warm + 2 * args.serve_requests + 1),
        ))  # fmt: skip
        stream = _stream(data.train, 0)
        t1 = time.perf_counter()
        tiered = Predictor.load(
            art, scm_dir=d / "scm", scm_cache=args.serve_cache, scm_io=args.scm_io,
            scm_io_threads=args.io_threads,
        )  # fmt: skip
        open_s = time.perf_counter() - t1
        emb = tiered.model.embeddings
        row: dict = {"open_s": round(open_s, 1), "copied_blocks": emb.tier.copied_blocks}
        for phase in ("cold", "warm"):
            if phase == "warm":
                for _ in range(args.serve_warm):
                    tiered.predict(next(stream))
            c0 = emb.counters()
            lat: dict[str, list[float]] = {"memory": [], "tiered": []}
            for _ in range(args.serve_requests):
                b = next(stream)
                for name, p in (("memory", memory), ("tiered", tiered)):
                    t1 = time.perf_counter()
                    scores = p.predict(b)
                    lat[name].append(time.perf_counter() - t1)
                    if name == "memory":
                        expected = scores
                if not torch.allclose(scores, expected, rtol=0, atol=1e-6):
                    raise SystemExit("bench_scm serve: the tier scored differently")
            c = emb.counters()
            hits, misses = (c[k] - c0[k] for k in ("scm_cache_hits", "scm_cache_misses"))
            row[phase] = {
                **{k: _percentiles_ms(v) for k, v in lat.items()},
                "hit_rate": round(hits / max(1, hits + misses), 4),
                "rows_read_per_request": round((c["scm_rows_read"] - c0["scm_rows_read"])
                                               / args.serve_requests, 1),
                "io_p50_us": c["scm_io_p50_us"], "io_p99_us": c["scm_io_p99_us"],
            }  # fmt: skip
            print(f"serve batch {batch} {phase}: {json.dumps(row[phase])}", file=sys.stderr)
        out[f"batch_{batch}"] = row
        emb.tier.close()
        del tiered, emb
    out["load_after"] = load_average()
    return out


# --- 4. Terabyte-sized tables ---------------------------------------------------------------------


def _rss_now_gb() -> float:
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30, 2)


def _dram_structures(emb, dense_bytes: int) -> dict:
    """The process's large structures, by name, in bytes (what the peak RSS is made of)."""
    tier, cache = emb.store.tier, emb.store.tier.cache
    slots = emb.device_tier  # its flat weights and optimizer state (embeddings/staged/)
    device = slots.weight.numel() * 4 + (slots.state.numel() * 4 if slots.state is not None else 0)
    held = emb.plan.tier("device").held
    plan = (
        sum(h.nbytes for h in held) if held is not None else sum(r.nbytes for r in emb.plan.remaps)
    )
    cells = [c.cell_contents for c in (getattr(cache.priority, "__closure__", None) or ())]
    priority = sum(x.numel() * x.element_size() for x in cells if isinstance(x, torch.Tensor))
    return {
        "device_tier_rows": device,  # hot rows + staging slots, weights and optimizer state
        "cache_rows": cache.capacity * tier.row_bytes,
        "cache_bookkeeping": cache.bookkeeping_bytes(),  # sorted id -> slot map, per-slot arrays
        "tier_block_maps": 2 * tier.num_blocks,  # written blocks and journaled blocks, a byte each
        "hot_id_map": emb.hot_map.nbytes(),  # Hotline's id -> hot slot map (hashed or dense)
        "hot_gids": emb.hot_gids.numel() * 8,
        "plan_device_rows": plan,  # the plan's sorted hot rows (sparse) or remaps (dense)
        "cache_priority": priority,  # the profile's seen rows and their counts
        "dense_params": dense_bytes,
    }


def bench_terabyte(args) -> dict:
    sizes = (args.tb_rows,) * 26
    run = Path(args.dir) / "runs" / "terabyte"
    dram = parse_bytes(args.tb_dram, "--tb-dram")
    rows_dram = int(dram * args.tb_row_share)  # the rest: bookkeeping, PyTorch, the pipeline
    hot = rows_dram // 2
    cfg = TrainConfig(
        arch_embedding_size=sizes, arch_sparse_feature_size=64, arch_mlp_bot=(13, 512, 256, 64),
        arch_mlp_top=(512, 512, 256, 1), synthetic_zipf=args.zipf,
        data_size=args.batch * args.tb_steps, test_data_size=args.batch * 8,
        mini_batch_size=args.batch,
        optimizer="sgd", learning_rate=0.1, device="cpu", seed=123, print_freq=10**9,
        progress=False, placement="tiered", hot_budget=str(hot), scm_cache=str(rows_dram - hot),
        scm_dir=str(run / "scm"), scm_io=args.scm_io, scm_io_threads=args.io_threads,
        profile_sample_rate=args.tb_profile_rate, out_dir=str(run),
    )  # fmt: skip
    rss_start = _rss_now_gb()  # Python, PyTorch, numba and the libraries, before anything big
    t0 = time.perf_counter()
    trainer = Trainer(cfg, checkpoints=False)
    build_s = time.perf_counter() - t0
    rss_built, peak_built = _rss_now_gb(), _rss_gb()
    emb = trainer.model.embeddings
    if args.tb_touch_cache:  # every page of the row cache resident now, as if it were full
        emb.store.tier.cache.data.zero_()
    rss_touched = _rss_now_gb()
    stream = trainer.data.train.batches(0, 0)
    times, samples = [], []
    scm = Path(emb.placement_info()["scm_dir"])
    stop = None
    t_start = time.perf_counter()
    for i in range(args.tb_steps):
        t1 = time.perf_counter()
        trainer.pipeline.progress(stream)
        times.append(time.perf_counter() - t1)
        if i % 100 == 0 or i == args.tb_steps - 1:
            disk = sum(f.stat().st_blocks * 512 for f in scm.iterdir() if f.is_file())
            c = emb.counters()
            samples.append({"step": i, "rss_gb": _rss_now_gb(), "peak_rss_gb": _rss_gb(),
                            "disk_gb": round(disk / 2**30, 2), "load": os.getloadavg()[0],
                            "hit_rate": c.get("scm_cache_hit_rate"),
                            "cache_rows": c.get("scm_cache_rows"),
                            "recent_samples_per_s": round(args.batch * min(100, len(times))
                                                          / sum(times[-100:]))})  # fmt: skip
            print(f"terabyte {json.dumps(samples[-1])}", file=sys.stderr, flush=True)
            if disk > args.tb_max_disk_gb * 2**30:
                stop = f"the tier's files reached {args.tb_max_disk_gb} GB on disk"
            elif time.perf_counter() - t_start > args.tb_seconds:
                stop = f"the time limit of {args.tb_seconds} s"
            if stop:
                break
    c, info = emb.counters(), emb.placement_info()
    rows_file = scm / "rows.dat"
    st = os.stat(rows_file)
    half = len(times) // 2
    dense = sum(p.numel() for p in trainer.model.dense_parameters()) * 4
    structures = _dram_structures(emb, dense)
    peak = _rss_gb()
    out = {
        "setup": {**_setup(), "tables": 26, "rows": sum(sizes), "dim": 64, "optimizer": "sgd",
                  "logical_row_bytes": sum(sizes) * 64 * 4, "dram_budget": dram,
                  "dram_for_rows": rows_dram, "hot_budget": hot, "scm_cache": rows_dram - hot,
                  "steps_asked": args.tb_steps, "profile_rate": args.tb_profile_rate,
                  "scm_io": args.scm_io, "zipf": args.zipf, "cache_touched": args.tb_touch_cache},
        "steps": len(times),
        "stopped_early_by": stop,
        "build_s": round(build_s, 1),
        "train_s": round(sum(times), 1),
        "samples_per_s_all": round(len(times) * args.batch / sum(times)),
        "samples_per_s_second_half": round(half * args.batch / sum(times[-half:])) if half else None,
        "file_apparent_bytes": st.st_size,
        "file_disk_bytes_du": st.st_blocks * 512,
        "scm_dir_disk_bytes_du": sum(f.stat().st_blocks * 512 for f in scm.iterdir()),
        "peak_rss_gb": peak,
        "bound_gb": round((dram + dense) / 2**30, 3),  # the issue's: budget + dense part
        "peak_under_bound": peak * 2**30 <= dram + dense,
        "rss_start_gb": rss_start,
        "rss_after_build_gb": rss_built,
        "peak_rss_during_build_gb": peak_built,
        "rss_after_touching_cache_gb": rss_touched,
        "dram_structures_bytes": structures,
        "dram_structures_gb": round(sum(structures.values()) / 2**30, 3),
        "placement": {k: info.get(k) for k in ("hot_rows", "staging_slots", "scm_cache_rows")},
        "hot_id_map_dense": emb.hot_map.dense,
        "tier": {k: v for k, v in c.items() if k.startswith("scm_")},
        "hotline": {k: c.get(k) for k in ("popular_input_share", "cold_rows_per_batch",
                                          "hidden_share", "exposed_gather_s", "gather_s")},
        "progress": samples,
        "load_after": load_average(),
    }  # fmt: skip
    del trainer, emb
    gc.collect()
    return out


def walk_sizes(args: argparse.Namespace, prog: str) -> None:
    """The sizes fixed by the cases (Kaggle's tables, the batch, the Terabyte-sized tables'
    rows), and under HYBRID_DLRM_QUICK (hybrid_dlrm/common/quick.py) every size at the docs'
    walk's."""
    args.tables, args.batch, args.tb_rows = tuple(KAGGLE_TABLE_SIZES), 2048, 10_000_000
    if not quick.active():
        return
    c = quick.cap
    scale = quick.cap_scale("Kaggle's tables", 1.0, like="--synthetic-table-scale")
    args.tables = tuple(scaled_table_sizes(scale))
    args.batch = c("the batch", args.batch, like="--mini-batch-size")
    args.tb_rows = c("terabyte's tables", args.tb_rows, like="--arch-embedding-size")
    args.file_gb = quick.cap_scale("--file-gb", args.file_gb, like="--size-gb")
    args.seconds = quick.cap_scale("--seconds", args.seconds)
    for name in ("dram", "hot_budget", "ct_hot", "ct_cache", "serve_cache", "tb_dram"):
        flag = "--" + name.replace("_", "-")
        setattr(args, name, str(c(flag, parse_bytes(getattr(args, name), flag))))
    args.train_samples = c("--train-samples", args.train_samples)
    args.test_samples = c("--test-samples", args.test_samples, like="--test-data-size")
    for name in ("profile_samples", "ct_profile_samples"):
        setattr(
            args,
            name,
            c("--" + name.replace("_", "-"), getattr(args, name), like="--profile-samples"),
        )
    args.rounds = c("--rounds", args.rounds)
    # steps (and requests) as a run's --num-batches; those before counting as a --warmup
    args.round_steps = c("--round-steps", args.round_steps, like="--steps")  # timed steps
    for name in ("warm_steps", "cache_steps", "layout_steps", "serve_requests",
                 "serve_warm", "tb_steps"):  # fmt: skip
        setattr(
            args, name, c(f"--{name.replace('_', '-')}", getattr(args, name), like="--num-batches")
        )
    for name in ("warmup_steps", "cache_warm_steps", "layout_warm_steps"):
        setattr(args, name, c(f"--{name.replace('_', '-')}", getattr(args, name), like="--warmup"))
    args.ct_rows = c("--ct-rows", args.ct_rows)
    quick.announce(prog)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "what",
        nargs="+",
        choices=[
            "disk",
            "kaggle",
            "contention",
            "threads",
            "switch",
            "caches",
            "layout",
            "bound",
            "terabyte",
            "serve",
        ],
    )
    p.add_argument("--dir", default="/tmp/scm-bench", help="the tier's files (deleted at the end)")
    p.add_argument("--keep", action="store_true", help="keep --dir")
    p.add_argument("--file-gb", type=float, default=2.0)
    p.add_argument("--depths", default="1,2,4,8,16,32,64")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--dram", default="512MB", help="kaggle: DRAM for rows, hot + cache")
    p.add_argument("--hot-budget", default="256MB")
    p.add_argument("--log-share", type=float, default=_LOG_SHARE,
                   help="kaggle: --scm-log-share of the tiered run")  # fmt: skip
    p.add_argument("--patched-too", action="store_true",
                   help="kaggle: a third run, the tier without its write-back log (--scm-log-share 0)")  # fmt: skip
    p.add_argument("--scm-io", default="direct", choices=["direct", "buffered"])
    p.add_argument("--io-threads", type=int, default=16)
    p.add_argument("--io-engine", default="auto", choices=["auto", "aio", "threads"])
    p.add_argument("--io-depth", type=int, default=64, help="the aio engine's requests in flight")
    p.add_argument("--train-samples", type=int, default=2048 * 400)
    p.add_argument("--test-samples", type=int, default=1 << 16)
    p.add_argument("--profile-samples", type=int, default=2_292_031)
    p.add_argument(
        "--shapes",
        choices=("kaggle", "dcnv2"),
        default="kaggle",
        help="kaggle: the Kaggle recipe; dcnv2: MLPerf's DLRM-DCNv2 with multi-hot bags",
    )
    p.add_argument(
        "--dcn-rows",
        type=int,
        default=400_000,
        help="kaggle --shapes dcnv2: rows per "
        "table at most (26 tables of dim 128 with Adagrad's state: 3.1 GB at 400k)",
    )
    p.add_argument("--mlp-bot", default="13-512-256-64-16")
    p.add_argument("--mlp-top", default="512-256-1")
    p.add_argument("--warmup-steps", type=int, default=40)
    p.add_argument("--fill", type=int, default=1, help="kaggle: write every block first (1/0)")
    p.add_argument("--warm-steps", type=int, default=3000, help="kaggle: fill the cache first")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--round-steps", type=int, default=40)
    p.add_argument("--cache-steps", type=int, default=5000)
    p.add_argument("--cache-warm-steps", type=int, default=3000)
    p.add_argument("--layout-steps", type=int, default=400, help="layout: mini-batches replayed")
    p.add_argument("--bound-steps", type=int, default=6000, help="bound: mini-batches replayed")
    p.add_argument("--bound-counted", type=int, default=1000, help="bound: the last, counted")
    p.add_argument("--layout-warm-steps", type=int, default=100, help="layout: not counted")
    p.add_argument("--ct-rows", type=int, default=500_000, help="contention: rows per table")
    p.add_argument("--ct-hot", default="16MB", help="contention: hot budget")
    p.add_argument("--ct-cache", default="16MB", help="contention: row cache")
    p.add_argument("--ct-profile-samples", type=int, default=200_000)
    p.add_argument(
        "--torch-threads", type=int, default=0,
        help="threads: torch's threads (0: the trainer's auto; 1: no intra-op pool, whose spin "
        "waits on a busy machine swamp the counts)",
    )  # fmt: skip
    p.add_argument("--serve-cache", default="64MB", help="serve: the tier's row cache")
    p.add_argument("--serve-requests", type=int, default=300, help="serve: timed per phase")
    p.add_argument("--serve-warm", type=int, default=3000, help="serve: requests before warm")
    p.add_argument("--tb-steps", type=int, default=2000)
    p.add_argument("--tb-dram", default="3GB")
    p.add_argument("--tb-profile-rate", type=float, default=0.05)
    p.add_argument("--tb-row-share", type=float, default=0.7, help="of --tb-dram: hot + cache")
    p.add_argument("--tb-seconds", type=float, default=1e9, help="stop training after this")
    p.add_argument("--tb-max-disk-gb", type=float, default=40.0, help="stop at this much on disk")
    p.add_argument("--tb-touch-cache", type=int, default=1, help="cache pages resident (1/0)")
    args = p.parse_args(argv)
    walk_sizes(args, "bench_scm.py")
    logging.basicConfig(level=logging.WARNING)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    report = {}
    try:
        for what in args.what:
            report[what] = {"disk": bench_disk, "kaggle": bench_kaggle, "caches": bench_caches,
                            "contention": bench_contention, "serve": bench_serve,
                            "threads": bench_threads,
                            "switch": bench_switch, "layout": bench_layout, "bound": bench_bound,
                            "terabyte": bench_terabyte}[what](args)  # fmt: skip
            print(json.dumps({what: report[what]}), file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
