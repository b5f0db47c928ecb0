"""Slurm's GPU devices made visible to Kubernetes: one DeviceTaintRule
(resource.k8s.io/v1, NoSchedule) per co-managed device a Slurm job holds, naming the job.
Pure: what the leader's reconciler (app.kube.controllers.device_taints) writes is decided
here from the Slurm listing's jobs and the nodes' ResourceSlices.

Invariants:
- one rule per device, its name fixed by node and device index (``rule_name``): a device
  that passes to another job keeps its rule, only the taint's value changes;
- nodeledger's own hold jobs (``LedgerHolds``) taint nothing: their devices are the pods';
- a job's device that the node's slices do not publish is skipped and reported, never
  guessed; a node without slices of the co-managed drivers is not co-managed here;
- every rule carries ``MANAGED_BY``: cleanup lists and deletes only those.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.claims import current_devices, device_attribute
from app.core.genericnode import MANAGED_BY
from app.core.slurm_models import LedgerHolds, SlurmJob

TAINT_KEY = "nodeledger.io/slurm-job"
EFFECT = "NoSchedule"
RULES_PATH = "/apis/resource.k8s.io/v1/devicetaintrules"
_MAX_NAME = 253  # a DNS-1123 subdomain
_UNSAFE = re.compile(r"[^a-z0-9.-]+")


@dataclass(frozen=True, slots=True)
class DeviceId:
    """A device as DRA names it: driver, pool, device (a DeviceTaintRule's selector)."""

    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class Carried:
    """What a rule taints and for which job: the part the reconciler compares."""

    device: DeviceId
    job_id: str


@dataclass(frozen=True, slots=True)
class WantedRule:
    name: str
    node: str  # the Kubernetes node
    index: int  # Slurm's gpu:gN, the slice attribute's N
    carried: Carried


@dataclass(frozen=True, slots=True)
class Plan:
    create: tuple[WantedRule, ...]
    update: tuple[WantedRule, ...]
    delete: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def rule_name(node: str, index: int) -> str:
    """``nodeledger-<node>-g<index>``, DNS-1123-safe; a name too long for one ends in a hash
    of the node so that two long names stay apart."""
    safe = _UNSAFE.sub("-", node.lower()).strip("-.") or "node"
    name = f"nodeledger-{safe}-g{index}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    tail = f"-{digest}-g{index}"
    return f"nodeledger-{safe}"[: _MAX_NAME - len(tail)].rstrip("-.") + tail


def identity(
    slices: Iterable[Mapping[str, Any]], node: str, drivers: Collection[str], attribute: str
) -> dict[int, DeviceId]:
    """Device index -> device, over ``node``'s current slices of ``drivers``; a device whose
    ``attribute`` is not a non-negative int has no index and is left out."""
    found: dict[int, DeviceId] = {}
    for (driver, pool, name), device in current_devices(slices, node, drivers).items():
        value = device_attribute(device.get("attributes") or {}, attribute, driver)
        index = value.get("int") if value is not None else None
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            found[index] = DeviceId(driver, pool, name)
    return found


def wanted_rules(
    jobs: Iterable[SlurmJob],
    nodes: Mapping[str, str],
    identities: Mapping[str, Mapping[int, DeviceId]],
    holds: LedgerHolds,
) -> tuple[dict[str, WantedRule], list[str]]:
    """The rules the listing's ``jobs`` want, by name, and what was skipped (a device the
    node's slices do not publish). ``nodes``: Slurm node -> Kubernetes node, the co-managed
    GPU nodes; ``identities``: each one's devices by index; ``holds``: the ledger's hold
    jobs, whose devices are pods' (every other job's are tainted). Of two jobs listed on
    one device (a COMPLETING one beside its successor) the later id names the rule."""
    wanted: dict[str, WantedRule] = {}
    skipped: list[str] = []
    for job in sorted(jobs, key=_job_order):
        if holds.owns(job) or not job.holds_resources:
            continue
        for allocation in job.allocations:
            node = nodes.get(allocation.node)
            if node is None:
                continue
            devices = identities.get(node, {})
            for index in allocation.devices:
                device = devices.get(index)
                if device is None:
                    skipped.append(
                        f"job {job.job_id}: device {index} of {node} is in no ResourceSlice"
                    )
                    continue
                name = rule_name(node, index)
                wanted[name] = WantedRule(name, node, index, Carried(device, job.job_id))
    return wanted, skipped


def plan(wanted: Mapping[str, WantedRule], carried: Mapping[str, Carried | None]) -> Plan:
    """What to create, update and delete so that ``carried`` (our rules, by name; None: one
    that does not read as ours) becomes ``wanted``."""
    return Plan(
        create=tuple(w for n, w in sorted(wanted.items()) if n not in carried),
        update=tuple(
            w for n, w in sorted(wanted.items()) if n in carried and carried[n] != w.carried
        ),
        delete=tuple(sorted(n for n in carried if n not in wanted)),
    )


def rule_spec(carried: Carried) -> dict[str, Any]:
    device = carried.device
    return {
        "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.device},
        "taint": {"key": TAINT_KEY, "value": carried.job_id, "effect": EFFECT},
    }


def rule_body(rule: WantedRule) -> dict[str, Any]:
    """The DeviceTaintRule to create."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": rule.name, "labels": dict(MANAGED_BY)},
        "spec": rule_spec(rule.carried),
    }


def carried_of(rule: Mapping[str, Any]) -> tuple[str, Carried | None]:
    """A listed rule's name and what it taints for which job (None: not in our shape, so
    the next update rewrites it)."""
    name = str((rule.get("metadata") or {}).get("name") or "")
    spec = rule.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    taint = spec.get("taint") or {}
    if taint.get("key") != TAINT_KEY or taint.get("effect") != EFFECT:
        return name, None
    device = DeviceId(
        str(selector.get("driver") or ""),
        str(selector.get("pool") or ""),
        str(selector.get("device") or ""),
    )
    return name, Carried(device, str(taint.get("value") or ""))


def _job_order(job: SlurmJob) -> tuple[int, str]:
    return (int(job.job_id), job.job_id) if job.job_id.isdigit() else (-1, job.job_id)
