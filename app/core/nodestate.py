"""What the core's decisions read of a node: protocols that NodeView (with holdings) and
NodeTotals (sums only) both satisfy, so that a decision never cares which one it got."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from app.core.resources import Resources


class Labelled(Protocol):
    @property
    def labels(self) -> Mapping[str, str]: ...


class KubeShare(Protocol):
    """What the Kubernetes cap reads (app.core.caps)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> Labelled: ...

    @property
    def allocatable(self) -> Resources: ...

    @property
    def held_by_kubernetes(self) -> Resources: ...


class NodeState(KubeShare, Protocol):
    """What the admission verdict reads (app.core.verdict): free and the not-admissible
    reason, computed once per view."""

    @property
    def free(self) -> Resources: ...

    @property
    def not_admissible_reason(self) -> str | None: ...
