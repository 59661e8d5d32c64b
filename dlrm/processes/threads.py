"""How many threads a run computes on, and how its idle threads wait.

    choice = threads.choose(cfg.threads)     # from affinity, the cgroup CPU quota, the environment
    print(choice.describe())                 # "threads 2 from affinity 2 / quota none ..."
    threads.apply(choice.threads)            # torch's intra- and inter-op pools, numba's

The count is what this process may actually use: the CPUs of its affinity mask, and fewer where
a cgroup CPU quota is set (containers, batch schedulers). A quota of 1.5 CPUs gives one thread,
not two: an OpenMP team that needs more CPU time than the quota is stopped whole for the rest of
each period (100 ms by default) with its threads waiting at a barrier, and a spinning thread
spends the quota on waiting; one thread under the quota is never stopped.

The wait: torch's CPU build runs on GNU OpenMP (torch/lib/libgomp.so.1; numba's `omp` threading
layer loads a second copy, the system's, with its own team), whose idle threads spin about
300,000 times before sleeping. That spinning is what makes two threads pay on a quiet machine
(a step is many short parallel regions; a sleeping thread must be woken for each) and what
collapses them beside a busy neighbour. The runtime reads its wait policy once, when it is
loaded, so it is left at OpenMP's default and the thread COUNT, which can change at any step,
follows the load instead (dlrm/processes/thread_watch.py); the figures behind that choice are in
docs/measurements/speed.md. Where the environment says how to wait (OMP_WAIT_POLICY,
GOMP_SPINCOUNT, KMP_BLOCKTIME), that is the user's choice and is reported as such.

No torch at import: `python -m dlrm.train` reads the limits before it imports torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from dlrm.errors import ConfigError
from dlrm.settings.sections import THREADS_MAX

__all__ = ["ThreadChoice", "apply", "choose", "cpu_quota", "usable_cpus", "wait_policy"]

# The variables that say how an OpenMP runtime's idle threads wait: where one is set, the
# user chose, and nothing here overrides it. KMP_BLOCKTIME is Intel's runtime (libiomp), which
# a torch built against it would load instead of libgomp.
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def wait_policy(environ: MutableMapping[str, str] = os.environ) -> str:
    """How idle OpenMP threads wait in this run: what the environment says, else OpenMP's own
    default (spin a while, then sleep)."""
    given = {k: environ[k] for k in WAIT_VARIABLES if environ.get(k)}
    if given:
        return " ".join(f"{k}={v}" for k, v in given.items())
    return "OpenMP's default wait"


# --- what this process may use -----------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _quota_in(directory: Path, v2: bool) -> float | None:
    """The CPU quota a cgroup directory sets, in CPUs; None where it sets none."""
    if v2:
        text = _read(directory / "cpu.max")  # "max 100000" or "150000 100000"
        parts = text.split() if text else []
        if len(parts) != 2 or parts[0] == "max":
            return None
        quota, period = parts
    else:
        quota, period = (_read(directory / f"cpu.cfs_{x}_us") for x in ("quota", "period"))
        if quota is None or period is None:
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _cpu_mounts(mountinfo: str) -> list[tuple[Path, str, bool]]:
    """(mount point, the cgroup path mounted there, cgroup v2) of the hierarchies holding the
    cpu controller: every cgroup2 mount, and v1 mounts with 'cpu' among their options."""
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        if fstype == "cgroup2" or (fstype == "cgroup" and "cpu" in options):
            mounts.append((Path(fields[4]), fields[3], fstype == "cgroup2"))
    return mounts


def cpu_quota(
    proc_cgroup: str | Path = "/proc/self/cgroup",
    mountinfo: str | Path = "/proc/self/mountinfo",
) -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors, in CPUs (cgroup v2
    `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`); None where none is set."""
    groups, mounts = _read(Path(proc_cgroup)), _read(Path(mountinfo))
    if not groups or not mounts:
        return None
    paths = {}  # (v2?, controller) -> the process's cgroup path
    for line in groups.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            if parts[0] == "0" and parts[1] == "":
                paths[True] = parts[2]
            elif "cpu" in parts[1].split(","):
                paths[False] = parts[2]
    quotas = []
    for mount, root, v2 in _cpu_mounts(mounts):
        if v2 not in paths:
            continue
        rel = os.path.relpath(paths[v2], root) if paths[v2].startswith(root) else "."
        directory = mount / rel if not rel.startswith("..") else mount
        if not directory.is_dir():  # a path outside this mount namespace: the mount's own
            directory = mount
        while True:  # a parent's quota limits its children
            q = _quota_in(directory, v2)
            if q is not None:
                quotas.append(q)
            if directory == mount or mount not in directory.parents:
                break
            directory = directory.parent
    return min(quotas) if quotas else None


def usable_cpus(affinity: int, quota: float | None) -> int:
    """Whole CPUs this process may keep busy: its affinity, fewer under a quota (rounded down,
    at least one: see the module docstring)."""
    return max(1, min(affinity, math.floor(quota))) if quota is not None else max(1, affinity)


# --- the choice ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    source: str  # what decided it: "affinity 2 / quota none", "--threads 3", "OMP_NUM_THREADS=1"
    affinity: int
    quota: float | None
    wait: str = ""  # how idle OpenMP threads wait (wait_policy's answer)

    @property
    def follows_load(self) -> bool:
        """Chosen here from affinity and quota (not by the user, not by the environment): the
        count may then follow the machine's load (dlrm/processes/thread_watch.py)."""
        return self.source.startswith("affinity ") and "processes" not in self.source

    def describe(self, now: int | None = None, others: float | None = None) -> str:
        """The start line; `now`/`others`: the count the load allows at start and the CPUs other
        processes kept busy, where the count follows the load."""
        limits = f"affinity {self.affinity} / quota {_quota_text(self.quota)}"
        where = limits if self.source == limits else f"{self.source} ({limits})"
        wait = f"; {self.wait}" if self.wait else ""
        if now is None:
            return f"threads {self.threads} from {where}{wait}"
        load = f"others keep {others:.1f} CPUs busy" if others is not None else "load unknown"
        return f"threads {now} of {self.threads} from {where}, following the load ({load}){wait}"


def _quota_text(quota: float | None) -> str:
    return "none" if quota is None else f"{quota:g}"


def choose(
    requested: int = 0,
    *,
    environ: MutableMapping[str, str] = os.environ,
    affinity: int | None = None,
    quota: float | None | str = "read",
    wait: str = "",
) -> ThreadChoice:
    """`requested` threads (`--threads`), or with 0 (auto): OMP_NUM_THREADS where the
    environment sets it (torchrun sets 1 for several processes a node), else the usable CPUs
    shared among this node's processes (LOCAL_WORLD_SIZE)."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0))
    if quota == "read":
        quota = cpu_quota()
    base = dict(affinity=affinity, quota=quota, wait=wait)
    if requested > 0:
        return ThreadChoice(requested, f"--threads {requested}", **base)
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given:  # the docs say it fixes the count: a value that cannot is refused, not ignored
        omp = given.split(",")[0].strip()  # a nested list: the outer level's
        if not (omp.isdigit() and 1 <= int(omp) <= THREADS_MAX):
            raise ConfigError(
                f"OMP_NUM_THREADS={given}: expected a whole number of threads from 1 to "
                f"{THREADS_MAX} (4 per CPU of this machine), or unset it for the automatic count"
            )
        return ThreadChoice(int(omp), f"OMP_NUM_THREADS={omp}", **base)
    usable = usable_cpus(affinity, quota)
    limits = f"affinity {affinity} / quota {_quota_text(quota)}"
    local = environ.get("LOCAL_WORLD_SIZE", "1")
    if local.isdigit() and int(local) > 1:
        return ThreadChoice(max(1, usable // int(local)), f"{limits} / {local} processes", **base)
    return ThreadChoice(usable, limits, **base)


def apply(threads: int, interop: bool = True) -> None:
    """Size the pools a run computes on: torch's intra-op team (OpenMP, MKL, oneDNN), its
    inter-op pool where it has not started yet, and numba's parallel loops (the synthetic
    generator's; capped by the threads numba's pool was started with)."""
    import numba
    import torch

    # numba first: starting its OpenMP layer may set the OpenMP team size to its own (all CPUs)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)
    if not interop:
        return
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass  # already started (set once per process): its threads only run torch.jit.fork work
