"""Host DRAM this process may still use, and byte sizes as people read them: the bottom of the
memory checks, shared by every package (embeddings/room.py adds the device and disk tiers and
what a run needs; data_pipeline checks the bags it would allocate against the same figure).

Host DRAM is the tightest of:
- `MemAvailable` in /proc/meminfo (what the kernel can give without swapping);
- the memory cgroup's limit minus its usage, at this process's cgroup and every ancestor up to
  the hierarchy's root (cgroup v2 `memory.max` / `memory.current`, v1 `memory.limit_in_bytes` /
  `memory.usage_in_bytes`); usage counts the page cache too, so its inactive file pages (which
  the kernel drops before it fails an allocation) are left out, as kubelet's working set does;
- `RLIMIT_AS` (`ulimit -v`) minus the address space this process already maps (VmSize);
- a limit given by the user (`--memory-limit`) minus what this process holds now (VmRSS).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as about 2**63 (rounded to a page)


@dataclass(frozen=True)
class Room:
    """Bytes this process may still use on a tier, and what bounds it (for messages)."""

    bytes: int
    source: str


def fmt_bytes(n: int | float) -> str:
    """1.5 GiB, 512 MiB, 20 KiB: binary units, as the size flags read them."""
    n = float(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def flag_bytes(n: int) -> str:
    """A size rounded down to a value a size flag reads back (e.g. 8.5GiB, 300MiB)."""
    if n >= 2**30:
        return f"{int(n / 2**30 * 10) / 10:g}GiB"
    if n >= 2**20:
        return f"{n // 2**20}MiB"
    return f"{n // 2**10}KiB"


# --- host DRAM --------------------------------------------------------------------------------


def _kib_field(path: Path, name: str) -> int | None:
    """`name:   123 kB` of a /proc file, in bytes (None when absent or unreadable)."""
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key == name:
                return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


def _stat_field(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _memory_cgroup(root: Path) -> tuple[int, Path, Path] | None:
    """(version, this process's memory cgroup directory, the hierarchy's mount point), from
    /proc/self/cgroup and /proc/self/mountinfo; None when there is no memory controller."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        mount_root, mount_point = fields[3], fields[4]
        if v1 is not None and fstype == "cgroup" and "memory" in options.split(","):
            version, path = 1, v1
        elif v1 is None and v2 is not None and fstype == "cgroup2":
            version, path = 2, v2
        else:
            continue
        base = root / mount_point.lstrip("/")
        rel = os.path.relpath(path, mount_root)
        # a cgroup outside the mounted part (a container's own namespace): the mount is its own
        inner = base if rel.startswith("..") else (base / rel).resolve()
        return version, inner, base.resolve()
    return None


def cgroup_room(root: Path = Path("/")) -> Room | None:
    """The tightest (limit - usage not counting inactive file pages) of this process's memory
    cgroup and its ancestors; None without a memory cgroup or a limit."""
    found = _memory_cgroup(root)
    if found is None:
        return None
    version, directory, top = found
    names = (
        ("memory.max", "memory.current", "inactive_file")
        if version == 2
        else ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    )
    best: Room | None = None
    d = directory
    while True:
        limit = _read_int(d / names[0])
        if limit is not None:
            usage = _read_int(d / names[1]) or 0
            used = max(0, usage - _stat_field(d / "memory.stat", names[2]))
            room = Room(max(0, limit - used), f"cgroup {names[0]} {fmt_bytes(limit)}")
            if best is None or room.bytes < best.bytes:
                best = room
        if d == top or d.parent == d or top not in d.parents:
            return best
        d = d.parent


def host_room(
    limit: int | None = None, root: Path = Path("/"), address_limit: int | None = -1
) -> Room | None:
    """Host DRAM this process may still use: the tightest bound (module docstring). `limit`:
    `--memory-limit`; `address_limit`: RLIMIT_AS (-1: this process's own); `root`: where /proc
    and the cgroup files are (tests give a directory of fake ones)."""
    proc = root / "proc"
    rooms: list[Room] = []
    available = _kib_field(proc / "meminfo", "MemAvailable")
    if available is not None:
        rooms.append(Room(available, "MemAvailable"))
    cgroup = cgroup_room(root)
    if cgroup is not None:
        rooms.append(cgroup)
    if address_limit == -1:
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        address_limit = None if soft == resource.RLIM_INFINITY else soft
    if address_limit is not None:
        mapped = _kib_field(proc / "self/status", "VmSize") or 0
        rooms.append(Room(max(0, address_limit - mapped), f"ulimit -v {fmt_bytes(address_limit)}"))
    if limit is not None:
        held = _kib_field(proc / "self/status", "VmRSS") or 0
        rooms.append(Room(max(0, limit - held), f"--memory-limit {flag_bytes(limit)}"))
    return min(rooms, key=lambda r: r.bytes) if rooms else None
