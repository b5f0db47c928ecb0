"""A pod's GPU devices from its DRA claims. Pure: claims and ResourceSlices are
plain API dicts (resource.k8s.io/v1), as the Kubernetes API returns them.

Kubernetes chooses a pod's GPU: the site's own DRA driver (e.g. NVIDIA's ``gpu.nvidia.com``)
publishes each node's devices in ResourceSlices, and kube-scheduler allocates one to the
pod's ResourceClaim (``status.allocation.devices.results[]``: request, driver, pool,
device). The ledger holds devices by index, the N of ``/dev/nvidiaN`` and of Slurm's
``gpu:gN``: each allocated device of a co-managed driver is looked up in the node's slices
and its index read from a device attribute (``index`` by default; NVIDIA's driver
publishes ``minor``). Its UUID is read too, from the attribute ``uuid`` (NVIDIA's driver
publishes it as a string), for the holding to show: informational, so a device without
one (or with one the ledger cannot keep) is held all the same. docs/gpu-identity.md has the
design.

Plain ``nvidia.com/gpu`` pods too (KEP-5004, Kubernetes 1.36 on): where a
DeviceClass names that extended resource (``spec.extendedResourceName``) and the node does
not advertise it, kube-scheduler allocates the request through DRA, in a claim it generates
for the pod and names in ``status.extendedResourceClaimStatus``. That claim is read like
the pod's own, and the request it allocates is those devices, not a count besides them.

Any doubt is an error naming the claim, never a guess: a bind without the device held in
Slurm would let a job take the pod's device.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.core.devices import valid_uuid
from app.core.errors import NodeledgerError
from app.core.records import HeldDevice
from app.core.resources import Resources


class ClaimDevicesError(NodeledgerError):
    """A pod's claims do not say which devices it has (yet). ``claim``: the claim at
    fault (namespace/name), or the pod's claim entry when no claim exists for it.
    ``retryable``: whether it may say so later (not allocated yet, a slice late)."""

    code = "claim_devices"
    http_status = 409

    def __init__(self, claim: str, reason: str, *, retryable: bool) -> None:
        super().__init__(f"ResourceClaim {claim}: {reason}")
        self.claim = claim
        self.reason = reason
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """One of a pod's claims: its entry in ``spec.resourceClaims`` and the ResourceClaim's
    name (None when it names a template the claim of which does not exist yet)."""

    entry: str
    claim: str | None


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """A co-managed GPU allocated to a claim, its index on the node and its UUID ("" when
    the slice publishes none the ledger can keep)."""

    claim: str  # namespace/name
    request: str
    driver: str
    pool: str
    device: str
    index: int
    uuid: str = ""

    @property
    def held(self) -> HeldDevice:
        """The device as a holding keeps it: the ledger needs no more of the claim."""
        return HeldDevice(self.index, self.uuid)


EXTENDED_ENTRY = "<extended-resources>"  # the generated claim's ClaimRef.entry (no spec entry)


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    """The claim kube-scheduler generated for the pod's extended resources backed by DRA
    (``status.extendedResourceClaimStatus``): its name and the extended resources (e.g.
    ``nvidia.com/gpu``) whose requests it allocates."""

    claim: str
    resources: frozenset[str]


def extended_claim(pod: Mapping[str, Any]) -> ExtendedClaim | None:
    """The pod's generated extended-resource claim, None when it has none (the requests are
    counted: the node advertises them, or the API serves no mapping)."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    name = status.get("resourceClaimName")
    if not name:
        return None
    mappings = status.get("requestMappings") or []
    resources = frozenset(str(m.get("resourceName") or "") for m in mappings) - {""}
    return ExtendedClaim(str(name), resources)


def pod_claims(pod: Mapping[str, Any]) -> tuple[ClaimRef, ...]:
    """The pod's ResourceClaims by name: ``spec.resourceClaims[].resourceClaimName``, or for
    a ``resourceClaimTemplateName`` the claim generated for it, as the resourceclaim
    controller records it in ``status.resourceClaimStatuses[]``. An entry the controller
    marked as needing no claim (``resourceClaimName`` null in the status) is left out. Last,
    the claim kube-scheduler generated for its extended resources (``extended_claim``)."""
    spec = pod.get("spec") or {}
    statuses = {
        s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    refs: list[ClaimRef] = []
    for entry in spec.get("resourceClaims") or []:
        name = str(entry.get("name") or "")
        if entry.get("resourceClaimName"):
            refs.append(ClaimRef(name, str(entry["resourceClaimName"])))
            continue
        status = statuses.get(name)
        if status is None:
            refs.append(ClaimRef(name, None))  # from a template, not generated yet
        elif status.get("resourceClaimName"):
            refs.append(ClaimRef(name, str(status["resourceClaimName"])))
    extended = extended_claim(pod)
    if extended is not None:
        refs.append(ClaimRef(EXTENDED_ENTRY, extended.claim))
    return tuple(refs)


def _claim_name(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def device_attribute(
    attributes: Mapping[str, Any], name: str, driver: str
) -> Mapping[str, Any] | None:
    """The device attribute ``name``: qualified (``domain/name``) or not, an unqualified
    attribute being in the driver's own domain (resource.k8s.io/v1 QualifiedName)."""
    domain, _, short = name.rpartition("/")
    candidates = [name]
    if not domain:
        candidates.append(f"{driver}/{name}")
    elif domain == driver:
        candidates.append(short)
    for key in candidates:
        value = attributes.get(key)
        if isinstance(value, Mapping):
            return value
    return None


def current_devices(
    slices: Iterable[Mapping[str, Any]], node: str, drivers: Collection[str]
) -> dict[tuple[str, str, str], Mapping[str, Any]]:
    """(driver, pool, device name) -> device, over the node's slices of ``drivers``, each
    pool at its newest generation (a pool being republished may list older slices too)."""
    newest: dict[tuple[str, str], int] = {}
    current: list[tuple[int, Mapping[str, Any]]] = []
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") not in drivers or spec.get("nodeName") != node:
            continue
        pool = spec.get("pool") or {}
        generation = int(pool.get("generation") or 0)
        key = (str(spec["driver"]), str(pool.get("name") or ""))
        newest[key] = max(newest.get(key, generation), generation)
        current.append((generation, spec))
    devices: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for generation, spec in current:
        driver, pool = str(spec["driver"]), str((spec.get("pool") or {}).get("name") or "")
        if generation != newest[(driver, pool)]:
            continue
        for device in spec.get("devices") or []:
            devices[(driver, pool, str(device.get("name") or ""))] = device
    return devices


def allocated_devices(
    claims: Sequence[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    *,
    node: str,
    drivers: Collection[str],
    attribute: str = "index",
) -> tuple[AllocatedDevice, ...]:
    """The devices of ``drivers`` allocated to ``claims`` (a pod's), on ``node``, with their
    indices read from ``attribute`` in the node's ``slices``, in claim and result order,
    and their UUIDs from the string attribute ``uuid`` ("" when missing or not one the
    ledger keeps: never an error). Raises ClaimDevicesError when a claim is not allocated,
    a device is not in the slices, or its index attribute is missing or not a non-negative
    int. Results of other drivers, and admin-access results (which do not own the device),
    are left out."""
    devices = current_devices(slices, node, drivers)
    found: list[AllocatedDevice] = []
    for claim in claims:
        name = _claim_name(claim)
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimDevicesError(name, "not allocated yet", retryable=True)
        for result in (allocation.get("devices") or {}).get("results") or []:
            driver = str(result.get("driver") or "")
            if driver not in drivers or result.get("adminAccess"):
                continue
            pool, device_name = str(result.get("pool") or ""), str(result.get("device") or "")
            where = f"device {device_name!r} of driver {driver} (pool {pool!r})"
            device = devices.get((driver, pool, device_name))
            if device is None:
                reason = f"{where} is not in node {node!r}'s ResourceSlices"
                raise ClaimDevicesError(name, reason, retryable=True)
            attributes = device.get("attributes") or {}
            value = device_attribute(attributes, attribute, driver)
            if value is None:
                reason = f"{where} has no attribute {attribute!r}"
                raise ClaimDevicesError(name, reason, retryable=False)
            index = value.get("int")
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                reason = f"{where}: attribute {attribute!r} is {dict(value)}, not an index"
                raise ClaimDevicesError(name, reason, retryable=False)
            request = str(result.get("request") or "")
            uuid = _uuid(attributes, driver)
            found.append(AllocatedDevice(name, request, driver, pool, device_name, index, uuid))
    return tuple(found)


def _uuid(attributes: Mapping[str, Any], driver: str) -> str:
    """The device's UUID from its string attribute ``uuid``, "" when it has none the ledger
    can keep (app.core.devices.valid_uuid)."""
    value = device_attribute(attributes, "uuid", driver)
    uuid = value.get("string") if value is not None else None
    return uuid if isinstance(uuid, str) and valid_uuid(uuid) else ""


def held_by_index(devices: Iterable[AllocatedDevice]) -> tuple[HeldDevice, ...]:
    """What the pod holds of ``devices``: index and UUID, by index; ClaimDevicesError if one
    is allocated twice (two claims of the pod naming one device: a pod cannot hold it
    twice)."""
    seen: dict[int, AllocatedDevice] = {}
    for device in devices:
        other = seen.get(device.index)
        if other is not None:
            reason = f"device index {device.index} is also allocated to {other.claim}"
            raise ClaimDevicesError(device.claim, reason, retryable=False)
        seen[device.index] = device
    return tuple(seen[index].held for index in sorted(seen))


def gpus_counted_once(
    requests: Resources,
    pod: Mapping[str, Any],
    allocated: Sequence[AllocatedDevice],
    held: Sequence[HeldDevice],
    gpu_resource: str,
) -> Resources:
    """The pod's ``requests`` with its GPUs counted once, as the devices ``held`` of its
    claims' co-managed ``allocated`` devices: a GPU request (``gpu_resource``) the generated
    claim allocates is those devices. ClaimDevicesError when that claim has fewer co-managed
    devices than the request counts (its DeviceClass selects another driver's: held that
    way the pod would hold fewer GPUs than it asked), and when the pod asks GPUs both by
    count and through DRA."""
    extended = extended_claim(pod)
    through = extended is not None and gpu_resource in extended.resources
    if extended is not None and through:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        name = f"{namespace}/{extended.claim}"
        found = sum(1 for device in allocated if device.claim == name)
        if found < requests.gpus:
            reason = (
                f"{found} device(s) of a co-managed GPU driver allocated for the pod's "
                f"{requests.gpus} {gpu_resource} (status.extendedResourceClaimStatus): the "
                f"DeviceClass whose spec.extendedResourceName is {gpu_resource} must select "
                "the co-managed drivers' devices"
            )
            raise ClaimDevicesError(name, reason, retryable=False)
    elif held and requests.gpus:
        reason = (
            f"the pod also asks for {requests.gpus} {gpu_resource}: GPUs through both an "
            "extended resource and DRA claims are not supported"
        )
        raise ClaimDevicesError(allocated[0].claim, reason, retryable=False)
    return replace(requests, gpus=len(held)) if held or through else requests


CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"


def class_mapping(device_class: Mapping[str, Any]) -> tuple[str, str]:
    """A DeviceClass as the mapping check reads it: its name and the extended resource it
    maps (``spec.extendedResourceName``; "" for none, or an API server that drops the field
    with its DRAExtendedResource gate off)."""
    name = str((device_class.get("metadata") or {}).get("name") or "")
    return name, str((device_class.get("spec") or {}).get("extendedResourceName") or "")


def mapping_note(
    classes: Iterable[tuple[str, str]], gpu_resource: str, version: str
) -> tuple[tuple[str, ...], str | None]:
    """The DeviceClasses that map ``gpu_resource`` (``class_mapping``), and when there is
    none, what the service falls back to (``version``: the API server's, "" unknown)."""
    names = tuple(sorted(name for name, resource in classes if resource == gpu_resource))
    if names:
        return names, None
    served = f"the API server ({version})" if version else "the API server"
    return names, (
        f"plain {gpu_resource} pods counted, not held by device: {served} has no DeviceClass "
        f"whose spec.extendedResourceName is {gpu_resource} (Kubernetes 1.36 or later with "
        "DRAExtendedResource on, and the class: docs/gpu-identity.md)"
    )
