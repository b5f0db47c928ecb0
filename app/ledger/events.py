"""Every event of the ledger's log is drafted here: its kind, text, holder, resources and
details. Pure: records in, an ``EventDraft`` out; the SQL layer turns a draft into the
row's values (app.ledger.columns.event_row) when it appends it.

Every change to a node or its holdings appends one naming the node, in the same
transaction: followers of the log (app.ledger.snapshot) learn of changes, from any
replica, only that way. The events of what happened outside the ledger (a Slurm push, a
gate's refusal, drift found in Slurm) are drafted here too, so that each kind has one
shape: a rejection names its holder and resources in their columns whoever refused it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
from app.ledger.tables import device_objects


@dataclass(frozen=True, slots=True)
class EventDraft:
    """An event to append: what the log's row will say (its id is the database's)."""

    at: datetime
    kind: EventKind
    node: str | None
    message: str
    holder: Holder | None = None
    resources: Resources | None = None
    details: dict[str, Any] = field(default_factory=dict)


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


def node_created(now: datetime, node: str, spec: NodeSpec, health_reason: str | None) -> EventDraft:
    message = f"node created, not admissible: {health_reason}" if health_reason else "node created"
    return EventDraft(
        now,
        EventKind.NODE_CREATED,
        node,
        message,
        resources=spec.capacity,
        details=spec_details(spec),
    )


def spec_changed(now: datetime, node: str, before: NodeSpec, after: NodeSpec) -> EventDraft:
    return EventDraft(
        now,
        EventKind.CAPACITY_CHANGED,
        node,
        "node spec changed",
        resources=after.capacity,
        details={"before": spec_details(before), "after": spec_details(after)},
    )


def cordon_changed(now: datetime, node: str, before: str | None, after: str | None) -> EventDraft:
    return EventDraft(
        now,
        EventKind.ADMISSIBILITY_CHANGED,
        node,
        f"cordoned: {after}" if after else "cordon cleared",
        details={"cordon_before": before, "cordon_after": after},
    )


def health_changed(now: datetime, node: str, before: str | None, after: str | None) -> EventDraft:
    return EventDraft(
        now,
        EventKind.ADMISSIBILITY_CHANGED,
        node,
        f"not admissible: {after}" if after else "admissible again",
        details={"before": before, "after": after},
    )


def node_deleted(now: datetime, node: str) -> EventDraft:
    return EventDraft(now, EventKind.NODE_DELETED, node, "node deleted")


def admitted(
    now: datetime,
    node: str,
    holder: Holder,
    requests: Resources,
    state: HoldingState,
    *,
    within_headroom: bool = False,
    devices: tuple[HeldDevice, ...] = (),
) -> EventDraft:
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
    return EventDraft(
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
) -> EventDraft:
    return EventDraft(
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
) -> EventDraft:
    """An admission refused because another holding has one of the GPU devices it named."""
    return EventDraft(
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


def gate_rejected(now: datetime, holding: Holding, reason: str) -> EventDraft:
    """An admission the gate (Slurm) refused after the ledger held it: the same shape as the
    ledger's own refusals (``rejected``), so that a query by holder finds both."""
    holder = holding.holder
    return EventDraft(
        now,
        EventKind.REJECTED,
        holding.node,
        reason,
        holder=holder,
        resources=holding.resources,
        # The holder in the details as well as in its columns: readers of the event log that
        # take it from the details (events recorded before the columns existed) still find it.
        details={"holder_kind": holder.kind.value, "holder_id": holder.id},
    )


def recorded(
    now: datetime, node: str, holder: Holder, resources: Resources, reason: str
) -> EventDraft:
    return EventDraft(
        now,
        EventKind.ADMITTED,
        node,
        f"recorded {holder.display_name or holder.id}: {reason}",
        holder=holder,
        resources=resources,
        details={"recorded": True},
    )


def resized(
    now: datetime, node: str, holder: Holder, old: Resources, new: Resources, reason: str
) -> EventDraft:
    """A pod's holding resized in place (app.core.pods.resize)."""
    return EventDraft(
        now,
        EventKind.ADMITTED,
        node,
        f"resized {holder.display_name or holder.id} from {describe_resources(old)}: {reason}",
        holder=holder,
        resources=new,
        details={"resized": True, "from": resources_details(old)},
    )


def moved(
    now: datetime, old: str, new: str, holder: Holder, resources: Resources, reason: str
) -> EventDraft:
    """A holder recorded on another node: released on the old one (followers go by node)."""
    return EventDraft(
        now,
        EventKind.RELEASED,
        old,
        f"moved to node {new!r}: {reason}",
        holder=holder,
        resources=resources,
    )


def confirmed(now: datetime, holding: Holding) -> EventDraft:
    message = f"confirmed {holding.holder.display_name or holding.holder.id}"
    if holding.devices:
        message += f" on {describe_devices(holding.devices)}"
    if holding.slurm_hold is not None:
        message += f", held by Slurm job {holding.slurm_hold}"
    return EventDraft(
        now,
        EventKind.CONFIRMED,
        holding.node,
        message,
        holder=holding.holder,
        resources=holding.resources,
        details=device_details(holding),
    )


def released(now: datetime, holding: Holding, reason: str) -> EventDraft:
    return EventDraft(
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


def device_details(holding: Holding) -> dict[str, Any]:
    """A holding's GPU devices (with their UUIDs, as the REST API shows them) and hold job,
    for an event's details; empty when it has neither (a counted holding's events stay as
    they were)."""
    details: dict[str, Any] = {}
    if holding.devices:
        details["devices"] = device_objects(holding.devices)
    if holding.slurm_hold is not None:
        details["slurm_hold"] = holding.slurm_hold
    return details


def holdings_replaced(
    now: datetime, node: str, kind: HolderKind, diff: SnapshotDiff, total: Resources
) -> EventDraft:
    return EventDraft(
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
) -> EventDraft:
    if target.is_zero():
        why = "Slurm jobs wait for resources in its partitions" if contended else "idle"
        message = f"headroom {describe_resources(before.target)} given back to Slurm ({why})"
    else:
        message = f"headroom lowered to {describe_resources(target)} (the node's maximum)"
    return EventDraft(
        now,
        EventKind.HEADROOM,
        node,
        message,
        resources=target,
        details={"before": describe_resources(before.target)},
    )


def headroom_granted(now: datetime, node: str, before: Resources, granted: Resources) -> EventDraft:
    """The grant changed outside an admission (a push lowered or read it back): an event of
    its own, so that followers of the log (app.ledger.snapshot) read the node again."""
    if granted.fits_within(before):
        verb = "lowered"
    else:
        verb = "raised" if before.fits_within(granted) else "changed"
    return EventDraft(
        now,
        EventKind.HEADROOM,
        node,
        f"headroom grant {verb} to {describe_resources(granted)}",
        resources=granted,
        details={"before": describe_resources(before)},
    )


def slurm_pushed(
    now: datetime, node: str, slurm_name: str, gres: str, reason: str, withheld: dict[str, int]
) -> EventDraft:
    """A push of the counts to Slurm (app.slurm.push); ``withheld``: the units it withheld."""
    return EventDraft(
        now,
        EventKind.SLURM_PUSHED,
        node,
        f"pushed {gres} to Slurm node {slurm_name} ({reason})",
        details={"gres": gres, "withheld": withheld},
    )


def slurm_drift(now: datetime, node: str, slurm_name: str, pushed: str) -> EventDraft:
    """A push that found Slurm had lost the pushed counts (app.core.plan); ``pushed`` is the
    GRES the push sent again."""
    return EventDraft(
        now,
        EventKind.SLURM_DRIFT,
        node,
        f"Slurm node {slurm_name} lost the pushed counts (slurmctld restart or "
        f"reconfigure?); pushed {pushed} again",
        details={"pushed": pushed},
    )


def noted(
    now: datetime, kind: EventKind, node: str | None, message: str, details: dict[str, Any] | None
) -> EventDraft:
    """Something another component saw happen (Ledger.record_event): its own text."""
    return EventDraft(now, kind, node, message, details=details or {})
