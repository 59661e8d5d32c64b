"""Threads that follow the machine's load: every CPU this process may use while the machine is
quiet, fewer while other processes keep some of them busy.

No one OpenMP setting is right on both a quiet and a shared machine (docs/measurements/speed.md):
- alone on 2 cores, two threads whose idle members spin (libgomp's default wait) train about
  1.6x faster than one thread; with `OMP_WAIT_POLICY=PASSIVE` two threads are no faster than
  one, because each of the step's many short parallel regions then wakes a sleeping thread;
- beside one CPU-bound neighbour, two spinning threads collapse (a thread waits at every barrier
  for its partner, descheduled for a whole time slice), while one thread keeps the core the
  neighbour leaves it and runs at its quiet speed.
So the count follows the load: how many CPUs of this process's affinity mask other processes kept
busy (their non-idle time in /proc/stat, stolen time included, minus this process's own CPU
time) is measured over a few seconds, and the run computes on the CPUs left. The first reading
spans the imports before the run (no waiting); later ones, every `WINDOW_S` seconds, between
steps: down at once, up only after two windows in a row agree (a neighbour between two jobs
does not make the run flap).

Results do not depend on the count: each kernel the step runs gives the same bits on one thread
as on two (tests/dlrm/test_thread_watch.py trains with the count changed every step and compares
with one thread). It has to be set from the training thread: OpenMP's thread count is a
per-thread setting.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

WINDOW_S = 2.0  # seconds between readings: long enough for /proc/stat's 10 ms ticks
SLACK = 0.3  # CPUs of others' load tolerated before a thread is given up (daemons, the kernel)
_HZ = os.sysconf("SC_CLK_TCK")


def busy_seconds(stat_text: str, cpus: set[int]) -> float:
    """Non-idle seconds of `cpus` since boot from /proc/stat's per-CPU lines (user, nice, system,
    irq, softirq, steal: guest time is inside user; idle and iowait are not busy)."""
    total = 0
    for line in stat_text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *ticks = line.split()
        if int(name[3:]) not in cpus:
            continue
        t = [int(x) for x in ticks] + [0] * 8
        total += t[0] + t[1] + t[2] + t[5] + t[6] + t[7]
    return total / _HZ


@dataclass
class Reading:
    wall: float
    busy: float  # non-idle seconds of the affinity CPUs (everyone's)
    own: float  # this process's CPU seconds (every thread)


@dataclass
class CpuSampler:
    """Readings of how busy this process's CPUs are, and how much of it is this process."""

    cpus: set[int] = field(default_factory=lambda: set(os.sched_getaffinity(0)))
    stat: Callable[[], str] = lambda: Path("/proc/stat").read_text()
    clock: Callable[[], float] = time.monotonic
    own: Callable[[], float] = time.process_time

    def read(self) -> Reading | None:
        try:
            text = self.stat()
        except OSError:
            return None  # no /proc (not Linux): nothing to follow
        return Reading(self.clock(), busy_seconds(text, self.cpus), self.own())

    @staticmethod
    def others(a: Reading, b: Reading) -> float:
        """CPUs other processes kept busy between two readings (0 when too close to tell)."""
        wall = b.wall - a.wall
        if wall <= 0.05:
            return 0.0
        return max(0.0, ((b.busy - a.busy) - (b.own - a.own)) / wall)


def fitting_threads(usable: int, others: float, maximum: int) -> int:
    """The threads that fit beside `others` busy CPUs of `usable`, between 1 and `maximum`."""
    return max(1, min(maximum, math.floor(usable - others + SLACK)))


def _set_count(n: int) -> None:
    from dlrm.processes import threads

    threads.apply(n, interop=False)


def announce(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class ThreadWatch:
    """A step hook (dlrm/pipelines/base.py's StepHook face; no torch imported here, so
    `--help` stays fast) that sets the thread count between steps from the load other processes
    put on this process's CPUs. `maximum`: the automatic choice (affinity and quota); `start`: the
    reading taken when the process started (its first decision spans the imports)."""

    def __init__(
        self,
        maximum: int,
        sampler: CpuSampler | None = None,
        start: Reading | None = None,
        set_count: Callable[[int], None] = _set_count,
        announce: Callable[[str], None] | None = announce,
    ) -> None:
        self.sampler = sampler or CpuSampler()
        self.maximum = maximum
        self.usable = len(self.sampler.cpus)
        self.set_count = set_count
        self.announce = announce
        self.threads = maximum
        self.others: float | None = None  # CPUs others kept busy in the last window
        self.changes = 0
        self._last = start or self.sampler.read()
        self._up_votes = 0

    def first(self) -> int:
        """The count to start training with: from the load since `start`, applied now."""
        now = self.sampler.read()
        if now is not None and self._last is not None:
            self.others = CpuSampler.others(self._last, now)
            self.threads = fitting_threads(self.usable, self.others, self.maximum)
            self._last = now
        self.set_count(self.threads)
        return self.threads

    def attach(self, trainer) -> None:
        pass

    def phase(self, name: str):
        return nullcontext()

    def step(self, batch, run):
        loss = run()
        if self._last is not None and self.sampler.clock() - self._last.wall >= WINDOW_S:
            self._decide()
        return loss

    def _decide(self) -> None:
        now = self.sampler.read()
        if now is None:
            return
        others = self.others = CpuSampler.others(self._last, now)
        self._last = now
        want = fitting_threads(self.usable, others, self.maximum)
        if want > self.threads:
            self._up_votes += 1
            if self._up_votes < 2:
                return
        self._up_votes = 0
        if want != self.threads:
            if self.announce is not None:
                self.announce(
                    f"threads {self.threads} -> {want}: other processes kept {others:.1f} of "
                    f"this run's {self.usable} CPUs busy"
                )
            self.threads = want
            self.changes += 1
            self.set_count(want)
