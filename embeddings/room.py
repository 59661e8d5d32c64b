"""What this process may still use on each tier where rows can live, and what a run needs there.

    room = inventory(torch.device("cpu"), memory_limit=24 * 2**30, disk_dir="runs/a/scm")
    room.host.bytes, room.host.source      # 23.1 GiB, "--memory-limit 24GiB" (the tightest bound)

Tiers: `device` (CUDA memory, from `torch.cuda.mem_get_info`; None on the CPU, where the device
tier is host DRAM), `host` (DRAM) and `disk` (free space where the SSD tier's files go).
Host DRAM is the tightest of the bounds hybrid_dlrm/common/host_memory.py lists (MemAvailable,
the memory cgroups, `ulimit -v`, `--memory-limit`): a user, a test or a benchmark plans for a
smaller machine than the one it runs on.
Every figure is what is left *beyond what this process holds now*, so a run's needs (tables,
optimizer state, dense part, activations, loader) compare with it directly.

`Needs` is a list of (tier, what, bytes): what a run will allocate, itemised for messages.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

# the host tier's figures live below data_pipeline, which checks its bags against them too
from hybrid_dlrm.common.host_memory import Room as Room
from hybrid_dlrm.common.host_memory import cgroup_room as cgroup_room
from hybrid_dlrm.common.host_memory import flag_bytes as flag_bytes
from hybrid_dlrm.common.host_memory import fmt_bytes as fmt_bytes
from hybrid_dlrm.common.host_memory import host_room as host_room

TIERS = ("device", "host", "disk")


# --- device memory and disk -------------------------------------------------------------------


def device_room(device, limit: int | None = None) -> Room | None:
    """Free CUDA memory on `device` (None on the CPU: the device tier is host DRAM there), or
    `--device-memory-limit` minus what this process has reserved, if tighter."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    room = Room(int(free), "free CUDA memory")
    if limit is not None:
        held = torch.cuda.memory_reserved(device)
        mine = Room(max(0, limit - held), f"--device-memory-limit {flag_bytes(limit)}")
        room = min(room, mine, key=lambda r: r.bytes)
    return room


def disk_room(directory: str | Path) -> Room:
    """Free bytes on the file system where `directory` is (or will be created)."""
    path = Path(directory).absolute()
    while not path.exists():
        path = path.parent
    return Room(shutil.disk_usage(path).free, f"free space under {directory}")


@dataclass(frozen=True)
class MemoryInventory:
    """What this process may still use per tier (None: no such tier, or nothing bounds it)."""

    device: Room | None
    host: Room | None
    disk: Room | None

    def on(self, tier: str) -> Room | None:
        return getattr(self, tier)


def inventory(
    device,
    memory_limit: int | None = None,
    device_memory_limit: int | None = None,
    disk_dir: str | Path | None = None,
) -> MemoryInventory:
    disk = disk_room(disk_dir) if disk_dir is not None else None
    return MemoryInventory(device_room(device, device_memory_limit), host_room(memory_limit), disk)


# --- what a run needs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    tier: str  # one of TIERS
    what: str
    bytes: int
    rows: bool = False  # embedding rows with their optimizer state (what a checkpoint holds)


@dataclass
class Needs:
    """What a run allocates per tier, itemised."""

    items: list[Need] = field(default_factory=list)
    disk_dir: str | None = None  # where the disk tier's needs go

    def add(self, tier: str, what: str, n: int, rows: bool = False) -> Needs:
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}")
        if n > 0:
            self.items.append(Need(tier, what, int(n), rows))
        return self

    def extend(self, other: Needs) -> Needs:
        self.items.extend(other.items)
        self.disk_dir = self.disk_dir or other.disk_dir
        return self

    def on(self, tier: str) -> int:
        return sum(i.bytes for i in self.items if i.tier == tier)

    def of(self, tier: str) -> list[Need]:
        """The tier's items, largest first."""
        return sorted((i for i in self.items if i.tier == tier), key=lambda i: -i.bytes)

    def rows_in_memory(self) -> int:
        return sum(i.bytes for i in self.items if i.rows and i.tier != "disk")

    def device_on_host(self) -> Needs:
        """The same needs where the device tier is host DRAM (the CPU)."""
        moved = [Need("host" if i.tier == "device" else i.tier, i.what, i.bytes, i.rows)
                 for i in self.items]  # fmt: skip
        return Needs(moved, self.disk_dir)
