"""GenericNode objects: what the service writes (pure builders) and reads (requests).

spec (the service creates it): alias (Slurm node name), type (Slurm), clusterName;
spec.admissionRequests (written by a custom scheduler): [{podUID, namespace, name,
requests: {cpu, memory, <gpu resource>}}].
status (the service writes it): capacity, allocatedResources [{type, allocated}], free,
headroom {target, granted, free} (the Kubernetes headroom, app.core.headroom), gpus
[{device, holderKind, holderID, holder, slurmHold}] (which holder has which GPU device),
conditions (Ready, SlurmSynced), admissionChecks [{podUID, result, message,
time}], lastSyncTime.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from app.core.components import Health
from app.core.headroom import HeadroomNode
from app.core.headroom import free as headroom_free
from app.core.presentation import format_cpu, format_memory
from app.core.records import HolderKind, Holding, NodeView
from app.core.resources import Resources

MANAGED_BY = {"app.kubernetes.io/managed-by": "nodeledger"}
# The status fields the mirror owns and compares; lastSyncTime is when they were last
# written, and admissionChecks belong to the admission-check protocol.
MIRRORED = ("capacity", "allocatedResources", "free", "headroom", "gpus", "conditions")
ADMITTED = "Admitted"
REJECTED = "Rejected"


def timestamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def amounts(r: Resources, gpu_resource: str) -> dict[str, str]:
    return {
        "cpu": format_cpu(max(0, r.cpu_millis)),
        "memory": format_memory(max(0, r.memory_bytes)),
        gpu_resource: str(max(0, r.gpus)),
    }


class NodeFigures(HeadroomNode, Protocol):
    """What a status is made of: a NodeView, or a NodeTotals (no holdings loaded)."""

    @property
    def held_by_slurm(self) -> Resources: ...


def new_object(view: NodeView, cluster_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodeledger.io/v1alpha1",
        "kind": "GenericNode",
        "metadata": {"name": view.name, "labels": dict(MANAGED_BY)},
        "spec": {"alias": view.slurm_name, "type": "Slurm", "clusterName": cluster_name},
    }


def _condition(
    kind: str, ok: bool, reason: str, message: str, previous: Mapping[str, Any], now: datetime
) -> dict[str, Any]:
    status = "True" if ok else "False"
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == kind), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status else timestamp(now)
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": since,
    }


def status_of(
    view: NodeFigures,
    slurm: Health | None,
    previous: Mapping[str, Any],
    now: datetime,
    gpu_resource: str,
    tainted: Mapping[int, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The status part the mirror owns (admissionChecks belong to the protocol);
    ``tainted``: the node's devices a DeviceTaintRule of ours taints for a Slurm job, by
    index: job id and rule (app.core.device_taints)."""
    reason = view.not_admissible_reason
    if slurm is None:
        synced = _condition(
            "SlurmSynced", False, "SlurmDisabled", "Slurm integration is off", previous, now
        )
    else:
        synced = _condition(
            "SlurmSynced",
            slurm.status == "ok",
            "Synced" if slurm.status == "ok" else "SlurmUnavailable",
            slurm.message,
            previous,
            now,
        )
    status: dict[str, Any] = {
        "capacity": amounts(view.allocatable, gpu_resource),
        "allocatedResources": [
            {"type": "Kubernetes", "allocated": amounts(view.held_by_kubernetes, gpu_resource)},
            {"type": "Slurm", "allocated": amounts(view.held_by_slurm, gpu_resource)},
        ],
        "free": amounts(view.free, gpu_resource),
        "headroom": headroom_of(view, gpu_resource),
        "conditions": [
            _condition(
                "Ready",
                reason is None,
                "Admissible" if reason is None else "NotAdmissible",
                reason or "pods that fit are admitted",
                previous,
                now,
            ),
            synced,
        ],
        "lastSyncTime": timestamp(now),
    }
    if isinstance(view, NodeView):  # figures without holdings say nothing of devices
        # Always written, [] too: a merge patch that left it out would keep the old list.
        status["gpus"] = gpus_of(view.holdings, tainted or {})
    return status


def gpus_of(
    holdings: tuple[Holding, ...], tainted: Mapping[int, tuple[str, str]]
) -> list[dict[str, Any]]:
    """Which holder has which GPU device on the node, by device: one entry per
    device a holding names (GPUs held by count only are in allocatedResources alone), with
    its UUID when the holding knows it; and each device a Slurm job has that a
    DeviceTaintRule taints (``tainted``: index -> job id, rule), unless a holding names it
    (one entry per device: the list's key)."""
    held = [
        {
            "device": device.index,
            **({"uuid": device.uuid} if device.uuid else {}),
            "holderKind": holding.holder.kind.value,
            "holderID": holding.holder.id,
            "holder": holding.holder.display_name or holding.holder.id,
            **({"slurmHold": holding.slurm_hold} if holding.slurm_hold is not None else {}),
        }
        for holding in holdings
        for device in holding.devices
    ]
    named = {entry["device"] for entry in held}
    held += [
        {
            "device": index,
            "holderKind": HolderKind.SLURM_JOB.value,
            "holderID": job,
            "holder": job,
            "deviceTaintRule": rule,
        }
        for index, (job, rule) in tainted.items()
        if index not in named
    ]
    return sorted(held, key=lambda entry: int(entry["device"]))


def headroom_of(view: NodeFigures, gpu_resource: str) -> dict[str, dict[str, str]]:
    """The node's headroom: its target, what Slurm was confirmed to withhold (holdings
    included) and what of that pods and reservations leave, all zero when it is off. Not
    its last use: that changes with admissions, not with the figures."""
    headroom = view.headroom
    return {
        "target": amounts(headroom.target, gpu_resource),
        "granted": amounts(headroom.granted, gpu_resource),
        "free": amounts(headroom_free(view), gpu_resource),
    }


def fingerprint(status: Mapping[str, Any]) -> str:
    """The mirrored fields as one canonical string: compact to keep for 15,000 nodes,
    equal exactly when the fields are, and parsed back into the previous status that
    status_of takes its lastTransitionTimes from."""
    mirrored = {k: status[k] for k in MIRRORED if k in status}
    return json.dumps(mirrored, sort_keys=True, separators=(",", ":"))
