"""The mapping between the ledger's records (app.core.records) and its tables' columns,
in one place: rows in, immutable records out, and the column values each record is
written as. A resource triple is always the three columns ``{prefix}cpu_millis``,
``{prefix}memory_bytes`` and ``{prefix}gpus``; resources_of and resource_values are the
only code that spells them out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any

from app.core.records import (
    NO_HEADROOM,
    EventKind,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    LedgerEvent,
    NodeHeadroom,
    NodeSpec,
    NodeTotals,
    NodeView,
)
from app.core.resources import Resources
from app.ledger.events import EventDraft
from app.ledger.tables import stored_devices

# The column prefixes of the resource triples: capacity and holdings (and events) "",
# then the node's reservation, headroom target and granted headroom.
PREFIXES = ("", "reserved_", "headroom_", "granted_")


def triple(prefix: str = "") -> tuple[str, str, str]:
    """The names of the columns of the resource triple ``prefix``."""
    return (f"{prefix}cpu_millis", f"{prefix}memory_bytes", f"{prefix}gpus")


# By position, built once: the hot path reads four triples per locked node.
_TRIPLES = {p: attrgetter(*triple(p)) for p in PREFIXES}

# Enum members by value: a dict lookup costs a tenth of calling the enum, which counts
# when loading 150,000 holdings.
HOLDER_KINDS = {k.value: k for k in HolderKind}
HOLDING_STATES = {s.value: s for s in HoldingState}


def resources_of(row: Any, prefix: str = "") -> Resources:
    """The resource triple ``prefix`` of a row (ORM object or Core row)."""
    return Resources(*_TRIPLES[prefix](row))


def resource_values(resources: Resources, prefix: str = "") -> dict[str, int]:
    """The columns that hold ``resources`` as the triple ``prefix``."""
    amounts = (resources.cpu_millis, resources.memory_bytes, resources.gpus)
    return dict(zip(triple(prefix), amounts, strict=True))


def assign(row: object, values: dict[str, Any]) -> None:
    """Set an ORM object's columns from column values."""
    for name, value in values.items():
        setattr(row, name, value)


@dataclass(frozen=True, slots=True)
class LockedNode:
    """A node as read under its row lock: its id for the writes that follow, and what the
    decisions read (its totals come from the holdings, summed apart)."""

    id: int
    name: str
    spec: NodeSpec
    cordon_reason: str | None
    health_reason: str | None
    headroom: NodeHeadroom

    def totals(self, held_by_kind: dict[HolderKind, Resources]) -> NodeTotals:
        return NodeTotals(
            self.name,
            self.spec,
            self.cordon_reason,
            self.health_reason,
            held_by_kind,
            self.headroom,
        )


@dataclass(frozen=True, slots=True)
class StoredHolding:
    """A holding with the keys a command writes it back by."""

    id: int
    node_id: int
    holding: Holding


def locked_node(row: Any) -> LockedNode:
    return LockedNode(
        row.id, row.name, node_spec(row), row.cordon_reason, row.health_reason, node_headroom(row)
    )


def stored_holding(row: Any) -> StoredHolding:
    """A holding row read with its node's name (``node_name``)."""
    return StoredHolding(row.id, row.node_id, holding_record(row, row.node_name))


def holding_record(row: Any, node_name: str) -> Holding:
    return Holding(
        node=node_name,
        holder=Holder(HOLDER_KINDS[row.holder_kind], row.holder_id, row.display_name),
        resources=resources_of(row),
        state=HOLDING_STATES[row.state],
        created_at=row.created_at,
        updated_at=row.updated_at,
        devices=stored_devices(row.devices),
        slurm_hold=row.slurm_hold,
    )


def holding_values(
    node_id: int, holder: Holder, requests: Resources, state: HoldingState, now: datetime
) -> dict[str, Any]:
    """A new holding's columns (devices and the Slurm hold: their defaults)."""
    return {
        "node_id": node_id,
        "holder_kind": holder.kind.value,
        "holder_id": holder.id,
        "display_name": holder.display_name,
        **resource_values(requests),
        "state": state.value,
        "created_at": now,
        "updated_at": now,
    }


def node_spec(row: Any) -> NodeSpec:
    return NodeSpec(
        capacity=resources_of(row),
        reserved=resources_of(row, "reserved_"),
        slurm_name=row.slurm_name,
        labels=dict(row.labels or {}),
    )


def spec_values(spec: NodeSpec) -> dict[str, Any]:
    """The node columns that hold ``spec``."""
    return {
        **resource_values(spec.capacity),
        **resource_values(spec.reserved, "reserved_"),
        "slurm_name": spec.slurm_name,
        "labels": dict(spec.labels),
    }


def node_headroom(row: Any) -> NodeHeadroom:
    target, granted = resources_of(row, "headroom_"), resources_of(row, "granted_")
    if row.headroom_used_at is None and target.is_zero() and granted.is_zero():
        return NO_HEADROOM
    return NodeHeadroom(target, granted, row.headroom_used_at)


def headroom_values(headroom: NodeHeadroom) -> dict[str, Any]:
    """The node columns that hold ``headroom``."""
    return {
        **resource_values(headroom.target, "headroom_"),
        **resource_values(headroom.granted, "granted_"),
        "headroom_used_at": headroom.used_at,
    }


def totals_record(row: Any, held_by_kind: dict[HolderKind, Resources]) -> NodeTotals:
    return locked_node(row).totals(held_by_kind)


def node_record(row: Any, holdings: Sequence[Any]) -> NodeView:
    return node_view(row, [holding_record(h, row.name) for h in holdings])


def node_view(row: Any, holdings: list[Holding]) -> NodeView:
    return NodeView(
        name=row.name,
        spec=node_spec(row),
        cordon_reason=row.cordon_reason,
        health_reason=row.health_reason,
        holdings=tuple(sorted(holdings, key=lambda h: (h.holder.kind, h.holder.id))),
        created_at=row.created_at,
        updated_at=row.updated_at,
        headroom=node_headroom(row),
    )


def views(nodes: Sequence[Any], holdings: Iterable[Sequence[Any]]) -> list[NodeView]:
    """Node rows with holding rows by position (app.ledger.repository's _HOLDING_VALUES), in
    the nodes' order (holdings of other nodes, created after the nodes were read, are left
    out). Unpacking a row costs a fraction of reading its attributes by name."""
    names = {n.id: n.name for n in nodes}
    by_node: dict[int, list[Holding]] = {n.id: [] for n in nodes}
    for (
        node_id,
        kind,
        holder_id,
        display,
        cpu,
        memory,
        gpus,
        held,
        created,
        updated,
        devices,
        hold,
    ) in holdings:
        on_node = by_node.get(node_id)
        if on_node is not None:
            holder = Holder(HOLDER_KINDS[kind], holder_id, display)
            resources, state = Resources(cpu, memory, gpus), HOLDING_STATES[held]
            on_node.append(
                Holding(
                    names[node_id],
                    holder,
                    resources,
                    state,
                    created,
                    updated,
                    stored_devices(devices),
                    hold,
                )
            )
    return [node_view(n, by_node[n.id]) for n in nodes]


def event_record(row: Any) -> LedgerEvent:
    # An event's resources are all three columns or none.
    resources = (
        None
        if row.cpu_millis is None
        else Resources(row.cpu_millis, row.memory_bytes or 0, row.gpus or 0)
    )
    return LedgerEvent(
        id=row.id,
        at=row.at,
        kind=EventKind(row.kind),
        node=row.node,
        holder_kind=HolderKind(row.holder_kind) if row.holder_kind else None,
        holder_id=row.holder_id,
        resources=resources,
        message=row.message,
        details=dict(row.details or {}),
    )


def event_row(draft: EventDraft) -> dict[str, Any]:
    """The values of an event's row (its id is the database's)."""
    holder, resources = draft.holder, draft.resources
    return {
        "at": draft.at,
        "kind": draft.kind.value,
        "node": draft.node,
        "holder_kind": holder.kind.value if holder else None,
        "holder_id": holder.id if holder else None,
        **(resource_values(resources) if resources else _NO_RESOURCES),
        "message": draft.message,
        "details": draft.details,
    }


_NO_RESOURCES: dict[str, int | None] = dict.fromkeys(triple())
