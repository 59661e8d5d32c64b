"""CPU time per thread of this process, from /proc/self/task/*/stat: what a benchmark counts when
wall times mean nothing (a shared machine) but CPU seconds per thread per step still do.

A thread is named by what Python knows of it (`threading.Thread.name`, matched by `native_id`)
or else by its kernel name (/proc/self/task/<tid>/comm), so threads Python did not start (torch's
OpenMP intra-op pool, a library's own) are counted too. `name_os_thread` gives the calling
thread a kernel name (prctl PR_SET_NAME, 15 bytes), which `top -H` and `ps -L` show as well.

Linux only: elsewhere `sample` returns {} and the counts are empty. Here (hybrid_dlrm/common)
rather than in perfmodel/: it is a process utility that benchmarks and tests use, with no model
of anything, like host_memory.py beside it.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from dataclasses import dataclass

_TASKS = "/proc/self/task"
_PR_SET_NAME = 15
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_POOL_SUFFIX = re.compile(r"_\d+$")  # ThreadPoolExecutor's `prefix_N`: one group per pool


def name_os_thread(name: str) -> None:
    """Give the calling thread the kernel name `name` (cut to 15 bytes); nothing where prctl is
    missing (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True)
class ThreadTime:
    name: str  # Python's name for the thread, else its kernel name
    python: bool  # started by Python (threading), not a native pool
    cpu_s: float  # user + system


def _stat_cpu_s(tid: str) -> float | None:
    try:
        with open(f"{_TASKS}/{tid}/stat") as f:
            text = f.read()
    except OSError:  # the thread ended between the listing and the read
        return None
    # the fields after the name, which may hold spaces and parentheses: utime and stime are
    # fields 14 and 15 of stat(5), the 12th and 13th after the closing parenthesis
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _comm(tid: str) -> str:
    try:
        with open(f"{_TASKS}/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def sample() -> dict[int, ThreadTime]:
    """Every live thread of this process: its CPU time so far, by kernel thread id."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return {}
    known = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out = {}
    for tid in tids:
        cpu = _stat_cpu_s(tid)
        if cpu is None:
            continue
        n = int(tid)
        name = known.get(n)
        out[n] = ThreadTime(name if name is not None else _comm(tid), name is not None, cpu)
    return out


def group_of(t: ThreadTime, main_tid: int, tid: int) -> str:
    """The thread's group in a report: `step` (the main thread, where the trainer steps), a
    Python thread pool by its prefix (`hotline` the staging worker, `scm-io` the tier's I/O
    threads), `native:<kernel name>` for threads Python did not start (torch's intra-op pool
    takes the name of the thread that made it, usually the process's)."""
    if tid == main_tid:
        return "step"
    if t.python:
        return _POOL_SUFFIX.sub("", t.name)
    return f"native:{t.name}"


class ThreadCpu:
    """CPU seconds per thread group between `start()` and `stop()` (threads that ended in
    between are lost with their time: their count is the process total's remainder)."""

    def __init__(self) -> None:
        self._t0: dict[int, ThreadTime] = {}
        self._p0 = 0.0
        self.main_tid = threading.main_thread().native_id

    def start(self) -> ThreadCpu:
        self._t0, self._p0 = sample(), _process_cpu_s()
        return self

    def stop(self) -> dict[str, float]:
        """CPU seconds per group since `start`, and `process` (every thread, ended ones too)."""
        now, p1 = sample(), _process_cpu_s()
        out: dict[str, float] = {}
        for tid, t in now.items():
            before = self._t0.get(tid)
            spent = t.cpu_s - (before.cpu_s if before is not None else 0.0)
            g = group_of(t, self.main_tid, tid)
            out[g] = out.get(g, 0.0) + spent
        out["process"] = p1 - self._p0
        return out


def _process_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def per_step_ms(spent: dict[str, float], steps: int) -> dict[str, float]:
    """`ThreadCpu.stop()`'s seconds as milliseconds per step, rounded for a report."""
    return {k: round(1e3 * v / max(1, steps), 2) for k, v in sorted(spent.items())}
