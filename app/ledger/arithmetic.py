"""Pure arithmetic on amounts: what a request is short of, how a snapshot changes holdings.

free = capacity - reserved - sum(holdings); the admission verdict (app.core.verdict) uses
``shortfalls`` for its fit check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.ledger.resources import ResourceName, Resources


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One resource the node cannot give: requested more than free."""

    resource: ResourceName
    requested: int
    free: int


def shortfalls(requested: Resources, free: Resources) -> tuple[Shortfall, ...]:
    """Every resource where ``requested`` exceeds ``free`` (free may be negative)."""
    if requested.fits_within(free):
        return ()  # the common case, a thousand times per extender call
    return tuple(
        Shortfall(name, requested.amount(name), free.amount(name))
        for name in Resources.NAMES
        if requested.amount(name) > free.amount(name)
    )


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
