"""The SSD tier's row file: rows at a fixed stride in checksummed 4 KiB blocks, read and written
by a pool of I/O threads, with the page cache bypassed (O_DIRECT) or not (`buffered`).

Block b holds the rows at slots b*rows_per_block ... (b+1)*rows_per_block - 1 (a row's slot: the
tier's layout, embeddings/ssd/layout.py; its global id in row-id order), each row its weights
then its optimizer state (float32, little-endian), and ends in a 32-byte trailer:
`block index (u64) | magic "SCM2" (u32) | era (u32) | generation (u32) | the tier's id (8 bytes)
| CRC-32 of the 4092 bytes before it (u32)`. The id ties each block to its tier (another tier's
file of the same layout is refused, not read); era and generation say when it was written, so the
tier can tell a block its journal failed to roll back (embeddings/ssd/tier.py). Rows never
straddle blocks, so one row is one aligned 4 KiB read. The file is created sparse at its full
size (`ftruncate`): a block never written takes no disk space, and the tier knows from its
`materialised` map (kept with every checkpoint) that its rows still have their initial values,
so reading them costs no I/O. A materialised block whose trailer or checksum does not match is
an ScmError naming the file, the block, its offset and what was expected: never numbers.

Two engines move the blocks; runs of consecutive blocks go in one request either way.
- `aio` (with O_DIRECT, where the kernel has it: embeddings/ssd/aio.py): one thread keeps up to
  `depth` requests in flight through Linux native AIO; about half the CPU per read of the pool
  below and no thread hand-offs.
- `threads`: `os.preadv`/`os.pwritev` release the GIL, so `threads` reads are in flight at once
  on a pool. While they are in flight the interpreter's switch interval is lowered
  (`_fast_switching`) and restored afterwards. Used for `buffered` files (AIO would block there)
  and where AIO is missing.
Latencies of every request are kept in a ring for p50/p99, and `queue_depth` is the mean number
in flight over the reads (Little's law: the sum of latencies over the wall time).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from embeddings.errors import ScmError
from embeddings.ssd.aio import PREAD, PWRITE, Aio
from hybrid_dlrm.common.crc import crc32_rows
from hybrid_dlrm.common.thread_cpu import name_os_thread

BLOCK = 4096
TRAILER = 32
PAYLOAD = BLOCK - TRAILER
MAGIC = 0x324D4353  # "SCM2"
_ERA, _GEN, _TAG = PAYLOAD + 12, PAYLOAD + 16, PAYLOAD + 20  # trailer fields after index, magic
MAX_RUN = 32  # consecutive blocks per call: larger runs would leave threads idle
IO_MODES = ("direct", "buffered")
IO_ENGINES = ("auto", "aio", "threads")
_LATENCY_RING = 1 << 16
SWITCH_INTERVAL_S = 2e-4
_switching = {"users": 0, "saved": 0.0}
_switching_lock = threading.Lock()


@contextmanager
def _fast_switching():
    """The GIL switch interval at SWITCH_INTERVAL_S while I/O threads are in flight, the caller's
    own setting before and after (nested and concurrent uses count). Each I/O thread takes the
    GIL back once per block: at Python's default 5 ms interval a busy training thread makes each
    of them wait that long (measured on 2 cores: 16 threads read 3.1k blocks/s beside a busy
    thread, 17k at 0.2 ms, 28k with the main thread idle)."""
    with _switching_lock:
        if not _switching["users"]:
            _switching["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_switching["saved"], SWITCH_INTERVAL_S))
        _switching["users"] += 1
    try:
        yield
    finally:
        with _switching_lock:
            _switching["users"] -= 1
            if not _switching["users"]:
                sys.setswitchinterval(_switching["saved"])


def io_error(e: OSError, path: Path, what: str) -> ScmError:
    """One line for a failed write of the tier's files: a full file system named by its mount."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        from data_pipeline.errors import mount_point

        return ScmError(
            f"{path}: no space left on the file system mounted at {mount_point(Path(path).parent)} "
            f"while writing {what}; the last checkpoint is intact (free space, then --resume)"
        )
    return ScmError(f"{path}: could not write {what} ({e.strerror or e})")


def stamp(buf: np.ndarray, era: int, generation: int) -> np.ndarray:
    """Blocks `buf` [n, BLOCK] marked as written in `era` at `generation` (before `write`)."""
    buf[:, _ERA : _ERA + 4].view(np.uint32)[:, 0] = era
    buf[:, _GEN : _GEN + 4].view(np.uint32)[:, 0] = generation
    return buf


def stamps(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(era, generation) of each block of `buf` [n, BLOCK], from their trailers."""
    era = buf[:, _ERA : _ERA + 4].copy().view(np.uint32).reshape(-1)
    gen = buf[:, _GEN : _GEN + 4].copy().view(np.uint32).reshape(-1)
    return era.astype(np.int64), gen.astype(np.int64)


def block_rows(buf: np.ndarray, rows_per_block: int, row_floats: int) -> torch.Tensor:
    """[blocks, rows per block, row floats] float32 view of the rows in `buf` [n, BLOCK]'s
    payloads (written through it land in the blocks)."""
    used = rows_per_block * row_floats * 4
    return torch.from_numpy(buf[:, :used].view(np.float32)).view(-1, rows_per_block, row_floats)


def aligned_blocks(n: int) -> np.ndarray:
    """A zeroed [n, BLOCK] uint8 array whose rows start on 4 KiB boundaries (O_DIRECT's rule)."""
    raw = np.zeros((max(n, 1) + 1) * BLOCK, dtype=np.uint8)
    off = (-raw.ctypes.data) % BLOCK
    return raw[off : off + n * BLOCK].reshape(n, BLOCK)


def _runs(blocks: np.ndarray) -> np.ndarray:
    """[n, 3]: (position in `blocks`, first block, count) for runs of consecutive sorted block ids,
    cut into pieces of at most MAX_RUN blocks (one request each)."""
    n = blocks.size
    if not n:
        return np.zeros((0, 3), dtype=np.int64)
    starts = np.flatnonzero(np.diff(blocks, prepend=blocks[0] - 2) != 1)  # each run's first
    ends = np.append(starts[1:], n)
    first = np.zeros(n, dtype=np.int64)
    first[starts] = 1
    run = np.cumsum(first) - 1  # the run of each position
    pos = np.flatnonzero((np.arange(n) - starts[run]) % MAX_RUN == 0)  # pieces of <= MAX_RUN
    count = np.minimum(MAX_RUN, ends[run[pos]] - pos)
    return np.stack([pos, blocks[pos], count], axis=1).astype(np.int64)


class BlockFile:
    """A file of `num_blocks` checksummed blocks. `create=True` starts it empty (sparse).
    `engine`: `auto` (AIO for direct files where the kernel has it, else threads), `aio` or
    `threads`; `depth`: AIO requests in flight; `threads`: the pool's size."""

    def __init__(
        self, path: Path, num_blocks: int, io: str = "direct", threads: int = 16, create=False,
        engine: str = "auto", depth: int = 64, tag: bytes = bytes(8),
    ) -> None:  # fmt: skip
        if io not in IO_MODES:
            raise ScmError(f"--scm-io: expected one of {', '.join(IO_MODES)}, got {io!r}")
        if engine not in IO_ENGINES:
            raise ScmError(
                f"--scm-io-engine: expected one of {', '.join(IO_ENGINES)}, got {engine!r}"
            )
        if engine == "aio" and io != "direct":
            raise ScmError(
                "--scm-io-engine aio needs --scm-io direct (AIO blocks on buffered files)"
            )
        self.path, self.num_blocks, self.io, self.threads = Path(path), num_blocks, io, threads
        self.tag = np.frombuffer(bytes(tag)[:8].ljust(8, b"\0"), dtype=np.uint8)
        size = num_blocks * BLOCK
        # a file made afresh (truncated) is never made through a link: the link's target is not
        # the tier's (an existing file may be one: a read-only export links the run's rows.dat)
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW if create else 0)
        if io == "direct":
            flags |= os.O_DIRECT
        try:
            self.fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ScmError(
                    f"{self.path}: a symbolic link; the tier makes its files afresh only where no "
                    "link is (remove it)"
                ) from None
            if e.errno == errno.EINVAL and io == "direct":
                raise ScmError(
                    f"{self.path}: the file system does not support O_DIRECT (--scm-io direct); "
                    "use --scm-io buffered"
                ) from None
            raise ScmError(f"{self.path}: cannot open the tier file ({e.strerror})") from None
        if create:
            try:
                os.ftruncate(self.fd, size)
            except OSError as e:
                os.close(self.fd)
                raise io_error(e, self.path, "the tier file") from None
        actual = os.fstat(self.fd).st_size
        if actual != size:
            os.close(self.fd)
            raise ScmError(
                f"{self.path}: truncated or resized tier file: {actual} bytes, expected {size} "
                f"({num_blocks} blocks of {BLOCK})"
            )
        self.aio = Aio.open(depth) if io == "direct" and engine != "threads" else None
        if engine == "aio" and self.aio is None:
            os.close(self.fd)
            raise ScmError(
                f"{self.path}: Linux AIO is not available here (--scm-io-engine aio); "
                "use --scm-io-engine threads or auto"
            )
        self.engine = "aio" if self.aio is not None else "threads"
        self.pool = (
            None
            if self.aio
            else ThreadPoolExecutor(
                threads,
                thread_name_prefix="scm-io",
                initializer=name_os_thread,
                initargs=("scm-io",),
            )  # its kernel name too: `top -H` and per-thread CPU counts tell them apart
        )
        self._lock = threading.Lock()
        self.latency_s = np.zeros(_LATENCY_RING)
        self.calls = 0
        self.blocks_read = self.blocks_written = 0
        self.busy_s = 0.0  # sum of call latencies (reads)
        self.wall_s = 0.0  # wall time of the batched reads

    def close(self) -> None:
        if self.fd >= 0:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
            if self.aio is not None:
                self.aio.close()
            os.close(self.fd)
            self.fd = -1

    # --- I/O ---------------------------------------------------------------------------------------

    def _record(self, seconds) -> None:
        with self._lock:
            for s in seconds:
                self.latency_s[self.calls % _LATENCY_RING] = s
                self.calls += 1
            self.busy_s += float(np.sum(seconds))

    def _parallel(self, fn, runs: np.ndarray) -> None:
        """`fn(list of runs)` on up to `threads` threads, runs dealt round-robin."""
        runs = runs.tolist()
        k = min(self.threads, len(runs))
        if k <= 1:
            fn(runs)
            return
        with _fast_switching():
            futures = [self.pool.submit(fn, runs[i::k]) for i in range(k)]
            for f in futures:
                f.result()

    def _aio(self, opcode: int, buf: np.ndarray, runs: np.ndarray) -> list[str]:
        """`runs` through AIO; returns error lines (empty: all done), latencies recorded."""
        if not runs.size:
            return []
        pos, first, count = runs.T
        with self.aio.lock:
            res, lat = self.aio.run(
                self.fd, opcode, np.uint64(buf.ctypes.data) + (pos * BLOCK).astype(np.uint64),
                first * BLOCK, (count * BLOCK).astype(np.uint64),
            )  # fmt: skip
        bad = np.flatnonzero(res != count * BLOCK)
        if bad.size:
            i = int(bad[0])
            n, at, want = int(res[i]), int(first[i]), int(count[i]) * BLOCK
            what = "read" if opcode == PREAD else "write"
            if n < 0 and opcode == PWRITE:
                return [str(io_error(OSError(-n, os.strerror(-n)), self.path, f"block {at}"))]
            if n < 0:
                return [f"{self.path}: {what} of block {at} failed ({os.strerror(-n)})"]
            if opcode == PWRITE:  # a short write: the rest, or the reason it cannot be written
                p = int(pos[i])
                try:
                    view = memoryview(buf[p : p + int(count[i])].reshape(-1))
                    self._write_all(view, at * BLOCK, n - n % BLOCK)
                except OSError as e:
                    return [str(io_error(e, self.path, f"block {at}"))]
                return self._aio(opcode, buf, runs[bad[1:]]) if bad.size > 1 else []
            end = " (a truncated tier file)" if opcode == PREAD else ""
            return [
                f"{self.path}: short {what} at offset {at * BLOCK}: {n} bytes, expected {want}{end}"
            ]
        if opcode == PREAD:
            self._record(lat)
        return []

    @staticmethod
    def _seal(buf: np.ndarray, pos: int, count: int) -> None:
        """Blocks pos .. pos+count-1 of `buf` get the CRC-32 of their bytes as their last word."""
        part = buf[pos : pos + count]
        part[:, BLOCK - 4 :].view(np.uint32)[:, 0] = crc32_rows(part, BLOCK - 4)

    def _verify(self, buf: np.ndarray, blocks: np.ndarray, pos: int, count: int) -> str | None:
        """The first of blocks pos .. pos+count-1 whose checksum does not match, described."""
        part = buf[pos : pos + count]
        crc = crc32_rows(part, BLOCK - 4)
        bad = np.flatnonzero(crc != part[:, BLOCK - 4 :].view(np.uint32)[:, 0])
        if bad.size:
            i = int(bad[0])
            return self._describe(int(blocks[pos + i]), part[i], int(crc[i]))
        return None

    def read(self, blocks: np.ndarray) -> np.ndarray:
        """Blocks `blocks` (sorted, unique, materialised) as [n, BLOCK] uint8, verified."""
        blocks = np.asarray(blocks, dtype=np.int64)
        buf = aligned_blocks(blocks.size)
        runs = _runs(blocks)
        t0 = time.perf_counter()
        if self.aio is not None:
            bad = self._aio(PREAD, buf, runs)
            if not bad and (err := self._verify(buf, blocks, 0, blocks.size)):
                bad.append(err)
        else:
            bad: list[str] = []

            def work(runs):
                lat = []
                for pos, first, count in runs:
                    view = memoryview(buf[pos : pos + count].reshape(-1))
                    t0 = time.perf_counter()
                    try:
                        n = os.preadv(self.fd, [view], first * BLOCK)
                    except OSError as e:
                        bad.append(f"{self.path}: read of block {first} failed ({e.strerror})")
                        return
                    lat.append(time.perf_counter() - t0)
                    if n != count * BLOCK:
                        bad.append(
                            f"{self.path}: short read at offset {first * BLOCK}: {n} bytes, "
                            f"expected {count * BLOCK} (a truncated tier file)"
                        )
                        return
                    if err := self._verify(buf, blocks, pos, count):
                        bad.append(err)
                        return
                self._record(lat)

            self._parallel(work, runs)
        wall = time.perf_counter() - t0
        if bad:
            raise ScmError(bad[0])
        index = buf[:, PAYLOAD : PAYLOAD + 8].copy().view(np.uint64).reshape(-1)
        wrong = np.flatnonzero(index != blocks.astype(np.uint64))
        if wrong.size:
            b = int(blocks[wrong[0]])
            raise ScmError(
                f"{self.path}: block {b} at offset {b * BLOCK} holds block {int(index[wrong[0]])}'s "
                "rows (a misplaced write)"
            )
        other = np.flatnonzero((buf[:, _TAG : _TAG + 8] != self.tag).any(axis=1))
        if other.size:
            b = int(blocks[other[0]])
            raise ScmError(
                f"{self.path}: block {b} at offset {b * BLOCK} belongs to another tier (id "
                f"{bytes(buf[other[0], _TAG : _TAG + 8]).hex()}..., this tier's is "
                f"{bytes(self.tag).hex()}...): the file was replaced by another run's"
            )
        with self._lock:
            self.blocks_read += blocks.size
            self.wall_s += wall
        return buf

    def _describe(self, b: int, block: np.ndarray, crc: int) -> str:
        magic = int(block[PAYLOAD + 8 : PAYLOAD + 12].view(np.uint32)[0])
        where = f"{self.path}: block {b} at offset {b * BLOCK}"
        if magic != MAGIC:
            return (
                f"{where}: not a written block (magic {magic:#010x}, expected {MAGIC:#010x}): the "
                "tier's map says it was written, so the file was truncated, zeroed or overwritten"
            )
        stored = int(block[BLOCK - 4 :].view(np.uint32)[0])
        return f"{where}: checksum {crc:08x}, expected {stored:08x} (a damaged tier file)"

    def write(self, blocks: np.ndarray, buf: np.ndarray) -> None:
        """Write blocks `blocks` (sorted, unique) from `buf` [n, BLOCK] (aligned), setting their
        trailers (era and generation as `stamp` left them). Not durable until `fsync`."""
        blocks = np.asarray(blocks, dtype=np.int64)
        buf[:, PAYLOAD : PAYLOAD + 8].view(np.uint64)[:, 0] = blocks.astype(np.uint64)
        buf[:, PAYLOAD + 8 : PAYLOAD + 12].view(np.uint32)[:, 0] = MAGIC
        buf[:, _TAG : _TAG + 8] = self.tag
        runs = _runs(blocks)
        if self.aio is not None:
            self._seal(buf, 0, blocks.size)
            errors = self._aio(PWRITE, buf, runs)
        else:
            errors: list[str] = []

            def work(runs):
                for pos, first, count in runs:
                    self._seal(buf, pos, count)
                    view = memoryview(buf[pos : pos + count].reshape(-1))
                    try:
                        self._write_all(view, first * BLOCK)
                    except OSError as e:
                        errors.append(str(io_error(e, self.path, f"block {first}")))
                        return

            self._parallel(work, runs)
        if errors:
            raise ScmError(errors[0])
        with self._lock:
            self.blocks_written += blocks.size

    def _write_all(self, view: memoryview, offset: int, done: int = 0) -> None:
        """`view[done:]` at `offset + done`: a short write (a file system filling up) goes on
        until the rest is written or the system call says why not (ENOSPC)."""
        while done < len(view):
            n = os.pwritev(self.fd, [view[done:]], offset + done)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += n

    def fsync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise io_error(e, self.path, "the tier file") from None

    # --- statistics -------------------------------------------------------------------------------

    def latency_percentiles_us(self) -> tuple[float | None, float | None]:
        n = min(self.calls, _LATENCY_RING)
        if not n:
            return None, None
        p50, p99 = np.percentile(self.latency_s[:n], [50, 99]) * 1e6
        return round(float(p50), 1), round(float(p99), 1)

    def queue_depth(self) -> float | None:
        """Mean reads in flight while reading (Little's law)."""
        return round(self.busy_s / self.wall_s, 2) if self.wall_s > 0 else None

    def disk_bytes(self) -> int:
        """Bytes the file occupies on disk (a sparse file: only written blocks)."""
        return os.fstat(self.fd).st_blocks * 512
