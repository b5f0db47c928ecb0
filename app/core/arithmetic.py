"""Pure arithmetic on amounts: what a request is short of, how a snapshot changes holdings.

free = capacity - reserved - sum(holdings); the admission verdict (app.core.verdict) uses
``shortfalls`` for its fit check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from app.core.resources import ResourceName, Resources


class Shortfall(NamedTuple):
    """One resource the node cannot give: requested more than free. A named tuple: the
    extender's filter makes these for hundreds of refused nodes per call."""

    resource: ResourceName
    requested: int
    free: int


def shortfalls(requested: Resources, free: Resources) -> tuple[Shortfall, ...]:
    """Every resource where ``requested`` exceeds ``free`` (free may be negative), in
    the order cpu, memory, gpu. Spelled out per resource: the extender asks it of hundreds of
    refused nodes per call."""
    short = []
    if requested.cpu_millis > free.cpu_millis:
        short.append(Shortfall("cpu", requested.cpu_millis, free.cpu_millis))
    if requested.memory_bytes > free.memory_bytes:
        short.append(Shortfall("memory", requested.memory_bytes, free.memory_bytes))
    if requested.gpus > free.gpus:
        short.append(Shortfall("gpu", requested.gpus, free.gpus))
    return tuple(short)


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """How a holder kind's holdings on one node change when replaced by a snapshot."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    @property
    def is_empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def diff_snapshot(
    current: Mapping[str, Resources], snapshot: Mapping[str, Resources]
) -> SnapshotDiff:
    """Which holder ids come, go or change amounts; ids are sorted for stable events."""
    return SnapshotDiff(
        added=tuple(sorted(snapshot.keys() - current.keys())),
        removed=tuple(sorted(current.keys() - snapshot.keys())),
        changed=tuple(
            sorted(k for k in current.keys() & snapshot.keys() if current[k] != snapshot[k])
        ),
    )
