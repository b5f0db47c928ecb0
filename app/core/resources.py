"""Resource amounts in integer base units: millicores, bytes, whole GPUs.

Everything inside the ledger is an integer in these units; conversions from Kubernetes
quantity strings and Slurm's MB/whole CPUs happen at the edges (app.core.quantities,
app.slurm).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Literal

ResourceName = Literal["cpu", "memory", "gpu"]

# Upper bounds for one amount. They keep every sum far inside a signed 64-bit column
# and reject nonsense (a typo of "16E" bytes) at the edge instead of deep in SQL.
MAX_CPU_MILLIS = 10**9  # one million cores
MAX_MEMORY_BYTES = 2**60  # one exbibyte
MAX_GPUS = 10**6


@dataclass(frozen=True, slots=True)
class Resources:
    """CPU in millicores, memory in bytes, GPUs as a whole count."""

    cpu_millis: int = 0
    memory_bytes: int = 0
    gpus: int = 0

    ZERO: ClassVar[Resources]

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_millis + other.cpu_millis,
            self.memory_bytes + other.memory_bytes,
            self.gpus + other.gpus,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_millis - other.cpu_millis,
            self.memory_bytes - other.memory_bytes,
            self.gpus - other.gpus,
        )

    def amount(self, name: ResourceName) -> int:
        """The amount of one resource by its API name."""
        match name:
            case "cpu":
                return self.cpu_millis
            case "memory":
                return self.memory_bytes
            case "gpu":
                return self.gpus

    def is_zero(self) -> bool:
        return self == Resources.ZERO

    def is_nonnegative(self) -> bool:
        return self.cpu_millis >= 0 and self.memory_bytes >= 0 and self.gpus >= 0

    def fits_within(self, limit: Resources) -> bool:
        """True when every amount is at most the same amount of ``limit``."""
        return (
            self.cpu_millis <= limit.cpu_millis
            and self.memory_bytes <= limit.memory_bytes
            and self.gpus <= limit.gpus
        )

    def at_most(self, limit: Resources) -> Resources:
        """Each amount no larger than the same amount of ``limit``."""
        return Resources(
            min(self.cpu_millis, limit.cpu_millis),
            min(self.memory_bytes, limit.memory_bytes),
            min(self.gpus, limit.gpus),
        )

    def at_least_zero(self) -> Resources:
        """Each amount no smaller than zero."""
        return Resources(max(0, self.cpu_millis), max(0, self.memory_bytes), max(0, self.gpus))

    @staticmethod
    def total(items: Iterable[Resources]) -> Resources:
        cpu = memory = gpus = 0
        for item in items:
            cpu += item.cpu_millis
            memory += item.memory_bytes
            gpus += item.gpus
        return Resources(cpu, memory, gpus)


Resources.ZERO = Resources()
