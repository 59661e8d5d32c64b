"""Linux native AIO (`io_setup`/`io_submit`/`io_getevents`) through ctypes: many 4 KiB O_DIRECT
reads or writes in flight from one thread, with no package to install.

Why not a pool of threads calling `os.preadv`: each call is a system call, a thread wake-up and a
GIL hand-off. On the 2-core development VM a 4 KiB O_DIRECT read cost about 11 us of the process's
CPU from 16 threads (30 us from one) and 6 us through AIO, where one `io_submit` hands the
kernel a whole batch (it plugs the block queue, so the virtual disk is notified once per batch)
and one `io_getevents` collects what completed; ctypes releases the GIL while the thread waits.
The reads of a mini-batch's cold rows then cost the training step a few milliseconds of the
machine's CPU instead of tens, and reached 48-85k reads/s from one thread (the thread pool
peaked at 41k).

AIO is asynchronous only with O_DIRECT (buffered files fall back to blocking submissions), so
the tier uses it for `--scm-io direct` and keeps the thread pool for `buffered`. io_uring would
be the newer interface; its Python bindings need a compiler or are unmaintained, and AIO does
what the tier needs. A kernel without AIO (or a sandbox refusing it) makes `Aio.open` return
None and the caller uses threads.

Control blocks and events are numpy structured arrays laid out as the kernel's `struct iocb`
(64 bytes) and `struct io_event` (32 bytes) on x86-64 and arm64 (both little-endian).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading
import time

import numpy as np

IOCB = np.dtype(
    [("data", "<u8"), ("key", "<u4"), ("rw_flags", "<i4"), ("opcode", "<u2"), ("prio", "<i2"),
     ("fd", "<u4"), ("buf", "<u8"), ("nbytes", "<u8"), ("offset", "<i8"), ("reserved", "<u8"),
     ("flags", "<u4"), ("resfd", "<u4")]
)  # fmt: skip
EVENT = np.dtype([("data", "<u8"), ("obj", "<u8"), ("res", "<i8"), ("res2", "<i8")])
PREAD, PWRITE = 0, 1
# system call numbers: io_setup, io_destroy, io_getevents, io_submit
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2), "arm64": (0, 1, 4, 2)}

assert IOCB.itemsize == 64 and EVENT.itemsize == 32


class AioError(OSError):
    pass


class Aio:
    """One AIO context with up to `depth` requests in flight. `run` is not reentrant: callers
    share an instance under its lock (the tier holds its own lock around file I/O anyway)."""

    def __init__(self, libc, ctx: int, depth: int, calls: tuple[int, int, int, int]) -> None:
        self.ctx, self.depth, self._libc = ctx, depth, libc
        self._setup, self._destroy, self._getevents, self._submit = calls
        self.lock = threading.Lock()

    @classmethod
    def open(cls, depth: int) -> Aio | None:
        """A context for `depth` requests, or None where the kernel or sandbox has no AIO."""
        calls = _SYSCALLS.get(platform.machine())
        if calls is None or os.environ.get("HYBRID_DLRM_NO_AIO"):
            return None
        libc = ctypes.CDLL(None, use_errno=True)  # CDLL: the GIL is released in calls
        libc.syscall.restype = ctypes.c_long
        ctx = ctypes.c_ulong(0)
        if libc.syscall(calls[0], ctypes.c_long(depth), ctypes.byref(ctx)) != 0:
            return None
        return cls(libc, ctx.value, depth, calls)

    def close(self) -> None:
        if self.ctx:
            self._libc.syscall(self._destroy, ctypes.c_ulong(self.ctx))
            self.ctx = 0

    def _call(self, nr: int, *args) -> int:
        while True:
            r = self._libc.syscall(nr, *args)
            if r >= 0:
                return r
            e = ctypes.get_errno()
            if e != errno.EINTR:
                return -e

    def run(
        self, fd: int, opcode: int, bufs: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Requests i = (`bufs[i]` address, `nbytes[i]`, `offsets[i]`) on `fd`, at most `depth`
        in flight; returns (result per request: bytes done or -errno, seconds from submission to
        completion seen)."""
        n = offsets.size
        cbs = np.zeros(n, dtype=IOCB)
        cbs["data"] = np.arange(n, dtype=np.uint64)
        cbs["opcode"], cbs["fd"] = opcode, fd
        cbs["buf"], cbs["nbytes"], cbs["offset"] = bufs, nbytes, offsets
        ptrs = cbs.ctypes.data + np.arange(n, dtype=np.uint64) * IOCB.itemsize
        events = np.zeros(self.depth, dtype=EVENT)
        res = np.zeros(n, dtype=np.int64)
        started = np.zeros(n)
        lat = np.zeros(n)
        ctx = ctypes.c_ulong(self.ctx)
        submitted = done = 0
        while done < n:
            room = min(self.depth - (submitted - done), n - submitted)
            if room > 0:
                at = ctypes.c_void_p(ptrs.ctypes.data + submitted * 8)
                now = time.perf_counter()
                got = self._call(self._submit, ctx, ctypes.c_long(room), at)
                if got < 0 and got != -errno.EAGAIN:
                    raise AioError(-got, f"io_submit: {os.strerror(-got)}")
                if got > 0:
                    started[submitted : submitted + got] = now
                    submitted += got
            if submitted == done:  # EAGAIN with nothing in flight: let the kernel breathe
                time.sleep(0.0005)
                continue
            got = self._call(
                self._getevents, ctx, ctypes.c_long(1), ctypes.c_long(self.depth),
                ctypes.c_void_p(events.ctypes.data), None,
            )  # fmt: skip
            if got < 0:
                raise AioError(-got, f"io_getevents: {os.strerror(-got)}")
            now = time.perf_counter()
            ids = events["data"][:got].astype(np.int64)
            res[ids] = events["res"][:got]
            lat[ids] = now - started[ids]
            done += got
        return res, lat
