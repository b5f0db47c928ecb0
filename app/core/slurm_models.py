"""What the service needs to know of Slurm, independent of the slurmrestd API version."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    cpus: int
    real_memory_mb: int
    specialized_memory_mb: int
    alloc_cpus: int
    alloc_memory_mb: int
    gres: str
    gres_used: str
    states: frozenset[str]
    reason: str
    extra: str

    @property
    def usable_memory_mb(self) -> int:
        """RealMemory minus MemSpecLimit: what jobs can be given."""
        return max(0, self.real_memory_mb - self.specialized_memory_mb)


@dataclass(frozen=True, slots=True)
class JobAllocation:
    """What one job holds on one node."""

    node: str
    cpus: int
    memory_mb: int
    gpus: int


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: str
    name: str
    user: str
    states: frozenset[str]
    allocations: tuple[JobAllocation, ...]

    @property
    def holds_resources(self) -> bool:
        # COMPLETING keeps its allocation until every node has cleaned up.
        return bool(self.states & {"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING"})


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    """Items and the cluster time they are current at (for the next ?update_time=)."""

    items: tuple[T, ...]
    last_update: int
