"""The events the ledger's commands append: their kinds, texts and details. Pure.

Every change to a node or its holdings appends one naming the node, in the same
transaction: followers of the log (app.ledger.snapshot) learn of changes, from any
replica, only that way. Each function returns the row's values (repository.event_values).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.core.arithmetic import SnapshotDiff
from app.core.ledger_errors import DeviceTaken
from app.core.presentation import describe_resources
from app.core.records import (
    EventKind,
    HeldDevice,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    NodeHeadroom,
    NodeSpec,
)
from app.core.resources import Resources
from app.core.verdict import Verdict
from app.ledger.columns import event_values
from app.ledger.tables import device_objects

Event = dict[str, Any]


def resources_details(resources: Resources) -> dict[str, int]:
    return {
        "cpu_millis": resources.cpu_millis,
        "memory_bytes": resources.memory_bytes,
        "gpus": resources.gpus,
    }


def spec_details(spec: NodeSpec) -> dict[str, Any]:
    return {
        "capacity": resources_details(spec.capacity),
        "reserved": resources_details(spec.reserved),
        "slurm_name": spec.slurm_name,
        "labels": spec.labels,
    }


def node_created(now: datetime, node: str, spec: NodeSpec, health_reason: str | None) -> Event:
    message = f"node created, not admissible: {health_reason}" if health_reason else "node created"
    return event_values(
        now,
        EventKind.NODE_CREATED,
        node,
        message,
        resources=spec.capacity,
        details=spec_details(spec),
    )


def spec_changed(now: datetime, node: str, before: NodeSpec, after: NodeSpec) -> Event:
    return event_values(
        now,
        EventKind.CAPACITY_CHANGED,
        node,
        "node spec changed",
        resources=after.capacity,
        details={"before": spec_details(before), "after": spec_details(after)},
    )


def cordon_changed(now: datetime, node: str, before: str | None, after: str | None) -> Event:
    return event_values(
        now,
        EventKind.ADMISSIBILITY_CHANGED,
        node,
        f"cordoned: {after}" if after else "cordon cleared",
        details={"cordon_before": before, "cordon_after": after},
    )


def health_changed(now: datetime, node: str, before: str | None, after: str | None) -> Event:
    return event_values(
        now,
        EventKind.ADMISSIBILITY_CHANGED,
        node,
        f"not admissible: {after}" if after else "admissible again",
        details={"before": before, "after": after},
    )


def node_deleted(now: datetime, node: str) -> Event:
    return event_values(now, EventKind.NODE_DELETED, node, "node deleted")


def admitted(
    now: datetime,
    node: str,
    holder: Holder,
    requests: Resources,
    state: HoldingState,
    *,
    within_headroom: bool = False,
    devices: tuple[HeldDevice, ...] = (),
) -> Event:
    name = holder.display_name or holder.id
    details: dict[str, Any] = {"state": state.value}
    if within_headroom:
        details["within_headroom"] = True
    message = (
        f"admitted {name} within the node's headroom" if within_headroom else f"admitted {name}"
    )
    if devices:
        details["devices"] = device_objects(devices)
        message += f" on {describe_devices(devices)}"
    return event_values(
        now,
        EventKind.ADMITTED,
        node,
        message,
        holder=holder,
        resources=requests,
        details=details,
    )


def rejected(
    now: datetime, node: str, holder: Holder, requests: Resources, verdict: Verdict
) -> Event:
    return event_values(
        now,
        EventKind.REJECTED,
        node,
        verdict.message,
        holder=holder,
        resources=requests,
        details={"shortfalls": [s.resource for s in verdict.shortfalls]},
    )


def device_taken(
    now: datetime,
    holder: Holder,
    requests: Resources,
    devices: tuple[HeldDevice, ...],
    refusal: DeviceTaken,
) -> Event:
    """An admission refused because another holding has one of the GPU devices it named."""
    return event_values(
        now,
        EventKind.REJECTED,
        refusal.node,
        refusal.message,
        holder=holder,
        resources=requests,
        details={
            "devices": device_objects(devices),
            "taken": [device for device, _ in refusal.taken],
        },
    )


def recorded(now: datetime, node: str, holder: Holder, resources: Resources, reason: str) -> Event:
    return event_values(
        now,
        EventKind.ADMITTED,
        node,
        f"recorded {holder.display_name or holder.id}: {reason}",
        holder=holder,
        resources=resources,
        details={"recorded": True},
    )


def moved(
    now: datetime, old: str, new: str, holder: Holder, resources: Resources, reason: str
) -> Event:
    """A holder recorded on another node: released on the old one (followers go by node)."""
    return event_values(
        now,
        EventKind.RELEASED,
        old,
        f"moved to node {new!r}: {reason}",
        holder=holder,
        resources=resources,
    )


def confirmed(now: datetime, holding: Holding) -> Event:
    message = f"confirmed {holding.holder.display_name or holding.holder.id}"
    if holding.devices:
        message += f" on {describe_devices(holding.devices)}"
    if holding.slurm_hold is not None:
        message += f", held by Slurm job {holding.slurm_hold}"
    return event_values(
        now,
        EventKind.CONFIRMED,
        holding.node,
        message,
        holder=holding.holder,
        resources=holding.resources,
        details=device_details(holding),
    )


def released(now: datetime, holding: Holding, reason: str) -> Event:
    return event_values(
        now,
        EventKind.RELEASED,
        holding.node,
        f"{reason} ({describe_devices(holding.devices)})" if holding.devices else reason,
        holder=holding.holder,
        resources=holding.resources,
        details=device_details(holding),
    )


def describe_devices(devices: tuple[HeldDevice, ...]) -> str:
    """GPU devices as events name them: "GPU device 1", "GPU devices 0, 2"."""
    indices = ", ".join(str(d.index) for d in devices)
    return f"GPU device{'s' if len(devices) > 1 else ''} {indices}"


def device_details(holding: Holding) -> dict[str, Any] | None:
    """A holding's GPU devices (with their UUIDs, as the REST API shows them) and hold job,
    for an event's details; None when it has neither (a counted holding's events stay as
    they were)."""
    details: dict[str, Any] = {}
    if holding.devices:
        details["devices"] = device_objects(holding.devices)
    if holding.slurm_hold is not None:
        details["slurm_hold"] = holding.slurm_hold
    return details or None


def holdings_replaced(
    now: datetime, node: str, kind: HolderKind, diff: SnapshotDiff, total: Resources
) -> Event:
    return event_values(
        now,
        EventKind.HOLDINGS_REPLACED,
        node,
        f"{kind.value} holdings replaced: +{len(diff.added)} -{len(diff.removed)} "
        f"~{len(diff.changed)}",
        resources=total,
        details={
            "holder_kind": kind.value,
            "added": list(diff.added),
            "removed": list(diff.removed),
            "changed": list(diff.changed),
        },
    )


def headroom_settled(
    now: datetime, node: str, before: NodeHeadroom, target: Resources, contended: bool = False
) -> Event:
    if target.is_zero():
        why = "Slurm jobs wait for resources in its partitions" if contended else "idle"
        message = f"headroom {describe_resources(before.target)} given back to Slurm ({why})"
    else:
        message = f"headroom lowered to {describe_resources(target)} (the node's maximum)"
    return event_values(
        now,
        EventKind.HEADROOM,
        node,
        message,
        resources=target,
        details={"before": describe_resources(before.target)},
    )


def headroom_granted(now: datetime, node: str, before: Resources, granted: Resources) -> Event:
    """The grant changed outside an admission (a push lowered or read it back): an event of
    its own, so that followers of the log (app.ledger.snapshot) read the node again."""
    if granted.fits_within(before):
        verb = "lowered"
    else:
        verb = "raised" if before.fits_within(granted) else "changed"
    return event_values(
        now,
        EventKind.HEADROOM,
        node,
        f"headroom grant {verb} to {describe_resources(granted)}",
        resources=granted,
        details={"before": describe_resources(before)},
    )
