"""CPU time and resident memory of a process, from /proc (Linux)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may contain spaces: the fields start after its closing ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class CpuWindow:
    """CPU used by ``pid`` between start and stop, as % of one core."""

    pid: int
    cpu0: float = 0.0
    wall0: float = 0.0

    def start(self) -> CpuWindow:
        self.cpu0, self.wall0 = cpu_seconds(self.pid), time.monotonic()
        return self

    def percent(self) -> float:
        wall = time.monotonic() - self.wall0
        return round(100 * (cpu_seconds(self.pid) - self.cpu0) / wall, 2) if wall else 0.0

    def cpu_used(self) -> float:
        return round(cpu_seconds(self.pid) - self.cpu0, 2)
