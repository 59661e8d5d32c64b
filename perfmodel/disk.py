"""The SSD tier's disk, measured: random 4 KiB block reads at each queue depth, with the tier's own
I/O engine (embeddings/ssd/file.py: O_DIRECT through Linux AIO where the file system and kernel
have them, else buffered reads on its thread pool), cached per machine and file system like the
rest of the hardware description (perfmodel/hardware.py).

The placement planner's prediction of a tiered candidate (perfmodel/placement_costs.py) turns the
row cache's misses per step into block reads and asks `read_seconds(disk, n)` how long they take:
the tier submits a staging's reads at once, up to `--scm-io-depth` in flight, so n blocks cost
`n / iops(depth)` at the deepest measured depth they fill, never less than one read's latency.

A measurement writes a 64 MiB file of sealed blocks (a sparse file's holes would be read without
touching the disk), then reads random blocks `depth` at a time for about 0.4 s per depth: a few
seconds in all. The file lives in a temporary directory under the directory the tier would use
(`--scm-dir`), or under its nearest existing parent (the same file system: nothing is created
where the tier will be), and is removed afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from embeddings.errors import ScmError
from embeddings.ssd.file import BLOCK, BlockFile, aligned_blocks
from hybrid_dlrm.common.atomic import write_json

VERSION = 1
DEPTHS = (1, 4, 16, 64)
FILE_BLOCKS = 16384  # 64 MiB: larger than any controller cache worth the name, short to write
SECONDS_PER_DEPTH = 0.4


def filesystem_key(directory: str | Path) -> str:
    """The file system a directory is on: its device number and type (from /proc/mounts), so a
    tmpfs, an NVMe and a network disk of one machine each get their own figures."""
    from perfmodel.machine_cache import machine_key

    path = Path(directory).resolve()
    while not path.exists():
        path = path.parent
    dev = os.stat(path).st_dev
    fstype = "?"
    best = -1
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > best:
                best, fstype = len(parts[1]), parts[2]
    except OSError:
        pass
    raw = f"{machine_key()}|{dev}|{fstype}"
    return f"{fstype}-{hashlib.sha1(raw.encode()).hexdigest()[:12]}"


def default_path(directory: str | Path) -> Path:
    from perfmodel.machine_cache import cache_dir

    return cache_dir() / f"disk-{filesystem_key(directory)}.json"


def _open(path: Path, depth: int, create: bool) -> BlockFile:
    """The tier's engine at `depth` in flight: O_DIRECT + AIO, else buffered (file systems
    without O_DIRECT, e.g. tmpfs)."""
    try:
        return BlockFile(path, FILE_BLOCKS, io="direct", create=create, depth=depth, threads=depth)
    except ScmError:
        return BlockFile(path, FILE_BLOCKS, io="buffered", create=create, threads=depth)


def measure(
    directory: str | Path, seconds_per_depth: float = SECONDS_PER_DEPTH, seed: int = 0
) -> dict:
    """Random block reads at each depth in DEPTHS on a scratch file under `directory`."""
    directory = Path(directory).absolute()
    while not directory.exists():  # the same file system, nothing created where the tier will be
        directory = directory.parent
    rng = np.random.default_rng(seed)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="disk-probe-", dir=directory) as tmp:
        path = Path(tmp) / "probe.dat"
        f = _open(path, 64, create=True)
        mode, engine = f.io, f.engine
        chunk = 1024
        for a in range(0, FILE_BLOCKS, chunk):
            blocks = np.arange(a, min(a + chunk, FILE_BLOCKS))
            f.write(blocks, aligned_blocks(blocks.size))
        f.fsync()
        f.close()
        figures = {}
        for depth in DEPTHS:
            f = _open(path, depth, create=False)
            times, n_read = [], 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds_per_depth or len(times) < 3:
                blocks = np.sort(rng.choice(FILE_BLOCKS, depth, replace=False))
                c0 = time.perf_counter()
                f.read(blocks)
                times.append(time.perf_counter() - c0)
                n_read += depth
            f.close()
            figures[str(depth)] = {
                "iops": round(depth / statistics.median(times), 1),
                "latency_us": round(statistics.median(times) * 1e6, 1),
                "reads": n_read,
            }
    return {
        "version": VERSION,
        "key": filesystem_key(directory),
        "directory": str(directory),
        "io": mode,
        "engine": engine,
        "block_bytes": BLOCK,
        "depths": figures,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "load_avg_1m": os.getloadavg()[0],
        "measure_s": round(time.perf_counter() - t_start, 2),
    }


def describe_disk(directory: str | Path | None = None, refresh: bool = False) -> dict:
    """The cached disk figures of the file system `directory` is on (default: the temporary
    directory's), measuring them first when absent or `refresh`."""
    directory = Path(directory) if directory else Path(tempfile.gettempdir())
    path = default_path(directory)
    if not refresh:
        try:
            cached = json.loads(path.read_text())
            if cached.get("version") == VERSION and cached.get("key") == filesystem_key(directory):
                return cached
        except (OSError, json.JSONDecodeError):
            pass
    desc = measure(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, desc)
    return desc


def read_seconds(disk: dict, n_blocks: float, depth: int = 64) -> float:
    """Seconds to read `n_blocks` random blocks submitted at once, at most `depth` in flight: at
    the IOPS of the deepest measured depth they fill (interpolated in log depth), never less than
    one read's latency at depth 1, nor than the time of a smaller measured batch (monotone)."""
    if n_blocks <= 0:
        return 0.0
    figs = {int(k): v for k, v in disk["depths"].items()}
    qd = max(1.0, min(float(n_blocks), float(depth)))
    ds = sorted(figs)
    if qd in figs:
        iops = figs[int(qd)]["iops"]
    elif qd <= ds[0]:
        iops = figs[ds[0]]["iops"]
    elif qd >= ds[-1]:
        iops = figs[ds[-1]]["iops"]
    else:
        hi = next(d for d in ds if d >= qd)
        lo = max(d for d in ds if d <= qd)
        w = 0.0 if hi == lo else (np.log(qd) - np.log(lo)) / (np.log(hi) - np.log(lo))
        iops = float(np.exp((1 - w) * np.log(figs[lo]["iops"]) + w * np.log(figs[hi]["iops"])))
    # a noisy depth (a hiccup while it was measured) must not make more reads take less time:
    # never less than a measured depth's batch that fits in these reads
    floor = max(d / figs[d]["iops"] for d in ds if d <= qd) if qd >= ds[0] else 0.0
    return max(n_blocks / iops, floor, figs[ds[0]]["latency_us"] * 1e-6)
