"""What a benchmark prints about the machine it ran on: the CPU model and its flags, read from
/proc/cpuinfo (no torch: a parent that only starts measured children need not load it)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flag_list() -> list[str]:
    """Every flag of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    return next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
