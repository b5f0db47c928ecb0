"""Builders of the pure core's records: a holding and a node's view with the defaults most
tests take (node n1, one moment T0, held), so that a test spells only what it is about."""

from __future__ import annotations

from datetime import UTC, datetime

from app.core.records import (
    NO_HEADROOM,
    HeldDevice,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    NodeHeadroom,
    NodeSpec,
    NodeView,
)
from app.core.resources import Resources

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def holding(
    kind: HolderKind,
    holder_id: str,
    resources: Resources,
    *,
    node: str = "n1",
    name: str = "",
    state: HoldingState = HoldingState.HELD,
    at: datetime = T0,
    devices: tuple[int, ...] = (),
    slurm_hold: str | None = None,
) -> Holding:
    """``holder_id``'s holding of ``resources`` on ``node``, made and last changed ``at``;
    ``devices`` by index."""
    held = tuple(HeldDevice(i) for i in devices)
    holder = Holder(kind, holder_id, name)
    return Holding(node, holder, resources, state, at, at, held, slurm_hold)


def node_view(
    spec: NodeSpec,
    *holdings: Holding,
    name: str = "n1",
    cordon: str | None = None,
    health: str | None = None,
    at: datetime = T0,
    headroom: NodeHeadroom = NO_HEADROOM,
) -> NodeView:
    """The ledger's view of node ``name`` holding ``holdings``."""
    return NodeView(name, spec, cordon, health, tuple(holdings), at, at, headroom)
