"""What a pod holds, by Kubernetes' own rules. Pure (pods are plain API dicts).

Effective request per resource (KEP-753 sidecars, pod overhead, pod-level resources):
- init containers run one after another; a restartable init container (a sidecar,
  restartPolicy Always) keeps running, so every later init container runs next to the
  sidecars started before it;
- app containers run together, next to all sidecars;
- effective = max(max over init steps, sum(app) + sum(sidecars)) + overhead;
- pod-level ``spec.resources.requests`` (PodLevelResources) replace the container sum
  for the resources they name.
A container's request defaults to its limit (the API server does that for resources with
a limit and no request); quantities round up.

``PodInfo`` is all the service keeps of a pod (150,000 pods must fit in a few tens of MB):
no object dict survives the decoding of a listed page or a watch event.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from app.core.claims import ClaimRef, extended_claim, pod_claims
from app.core.quantities import cpu_millis, gpu_count, memory_bytes
from app.core.resources import Resources


class _Resources(TypedDict, total=False):
    requests: dict[str, Any]
    limits: dict[str, Any]


class _Container(TypedDict, total=False):
    name: str  # to match its status (pod_allocated)
    resources: _Resources
    restartPolicy: str


class _Spec(TypedDict, total=False):
    nodeName: str
    containers: list[_Container]
    initContainers: list[_Container]
    overhead: dict[str, Any]
    resources: _Resources
    resourceClaims: list[dict[str, Any]]


class _Meta(TypedDict, total=False):
    uid: str
    namespace: str
    name: str


class _ContainerStatus(TypedDict, total=False):
    # What the kubelet allocated to the container and applied (an in-place resize): not its
    # state (``PodInfo.stopped``), which would double the cost of parsing a listed page,
    # and a listed pod is there, where it decides nothing.
    name: str
    allocatedResources: dict[str, Any]
    resources: _Resources


class _Status(TypedDict, total=False):
    phase: str
    containerStatuses: list[_ContainerStatus]
    initContainerStatuses: list[_ContainerStatus]
    # The claims generated for it (app.core.claims.pod_claims): few pods have them.
    resourceClaimStatuses: list[dict[str, Any]]
    extendedResourceClaimStatus: dict[str, Any]


class PodShape(TypedDict, total=False):
    """The fields of a pod that pod_info reads (a LIST parses only these)."""

    metadata: _Meta
    spec: _Spec
    status: _Status


GPU_RESOURCE = "nvidia.com/gpu"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


# Pods repeat a handful of quantity strings ("100m", "128Mi"): parsing each once instead of
# 150,000 times takes most of the decoding out of a full resync.
_cpu = functools.lru_cache(maxsize=4096)(cpu_millis)
_memory = functools.lru_cache(maxsize=4096)(memory_bytes)
_gpus = functools.lru_cache(maxsize=256)(gpu_count)


def _amounts(requests: Mapping[str, Any], gpu_resource: str) -> Resources:
    return Resources(
        _cpu(requests["cpu"]) if "cpu" in requests else 0,
        _memory(requests["memory"]) if "memory" in requests else 0,
        _gpus(requests[gpu_resource]) if gpu_resource in requests else 0,
    )


def _container(container: Mapping[str, Any], gpu_resource: str) -> Resources:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return _amounts(merged, gpu_resource)


def _max(a: Resources, b: Resources) -> Resources:
    return Resources(
        max(a.cpu_millis, b.cpu_millis), max(a.memory_bytes, b.memory_bytes), max(a.gpus, b.gpus)
    )


def _min(a: Resources, b: Resources) -> Resources:
    return Resources(
        min(a.cpu_millis, b.cpu_millis), min(a.memory_bytes, b.memory_bytes), min(a.gpus, b.gpus)
    )


def pod_requests(pod: Mapping[str, Any], gpu_resource: str = GPU_RESOURCE) -> Resources:
    return _effective(pod.get("spec") or {}, gpu_resource, lambda c: _container(c, gpu_resource))


def pod_allocated(
    pod: Mapping[str, Any], gpu_resource: str = GPU_RESOURCE, requests: Resources | None = None
) -> Resources | None:
    """What the pod's kubelet allocated to it, by the rules of ``pod_requests`` over each
    container's status: the larger of what the kubelet admitted (``allocatedResources``)
    and what it applied (``resources.requests``), which differ while a resize is in
    progress; what it reports nothing of counts as the spec asks. None: the kubelet reports
    no allocation (the pod has not started, or the kubelet predates in-place resize).
    ``requests``: the pod's (pod_requests), the answer when every container is allocated as
    its spec asks, the common case, which then costs no second pass over the spec."""
    status = pod.get("status") or {}
    reported: dict[str, Mapping[str, Any]] = {
        str(entry.get("name", "")): entry
        for key in ("initContainerStatuses", "containerStatuses")
        for entry in status.get(key) or []
        if entry.get("allocatedResources") or (entry.get("resources") or {}).get("requests")
    }
    if not reported:
        return None
    spec = pod.get("spec") or {}
    allocated: dict[int, Resources] = {}  # by id() of the spec's container
    for container in (*(spec.get("initContainers") or []), *(spec.get("containers") or [])):
        entry = reported.get(container.get("name", ""))
        if entry is not None:
            asked = _container(container, gpu_resource)
            if (amounts := _reported(entry, asked, gpu_resource)) != asked:
                allocated[id(container)] = amounts
    if not allocated:
        return requests if requests is not None else pod_requests(pod, gpu_resource)

    def amounts_of(container: Mapping[str, Any]) -> Resources:
        found = allocated.get(id(container))
        return _container(container, gpu_resource) if found is None else found

    return _effective(spec, gpu_resource, amounts_of)


def _reported(entry: Mapping[str, Any], asked: Resources, gpu_resource: str) -> Resources:
    """A container's status as its requests: per resource the larger of what the kubelet
    admitted and applied, or what the spec asks where it names neither."""
    allocated = entry.get("allocatedResources") or {}
    applied = (entry.get("resources") or {}).get("requests") or {}
    named = _max(_amounts(allocated, gpu_resource), _amounts(applied, gpu_resource))
    return Resources(
        named.cpu_millis if "cpu" in allocated or "cpu" in applied else asked.cpu_millis,
        named.memory_bytes if "memory" in allocated or "memory" in applied else asked.memory_bytes,
        named.gpus if gpu_resource in allocated or gpu_resource in applied else asked.gpus,
    )


def _effective(
    spec: Mapping[str, Any], gpu_resource: str, amounts_of: Callable[[Any], Resources]
) -> Resources:
    """The pod's effective request, each container counting ``amounts_of`` it."""
    sidecars = Resources.ZERO
    init_peak = Resources.ZERO
    for container in spec.get("initContainers") or []:
        amounts = amounts_of(container)
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + amounts
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, sidecars + amounts)
    apps = Resources.total([amounts_of(c) for c in spec.get("containers") or []])
    effective = _max(init_peak, apps + sidecars)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    if pod_level:
        named = _amounts(pod_level, gpu_resource)
        effective = Resources(
            named.cpu_millis if "cpu" in pod_level else effective.cpu_millis,
            named.memory_bytes if "memory" in pod_level else effective.memory_bytes,
            named.gpus if gpu_resource in pod_level else effective.gpus,
        )
    return effective + _amounts(spec.get("overhead") or {}, gpu_resource)


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str | None
    phase: str
    requests: Resources
    # DRA claims (spec.resourceClaims, or generated for its extended resources): GPUs the
    # requests do not count may be the claims' devices, which the extender's bind admits,
    # or pod accounting counts.
    claims: bool = False
    claim_refs: tuple[ClaimRef, ...] = ()
    # Its GPU request is allocated through the claim kube-scheduler generated for it
    # (KEP-5004): those devices, not a count besides them (``counted``).
    extended_gpus: bool = False
    # Every container of its status was terminated (app.core.pod_release): of a pod deleted
    # while its node is lost, the one proof the pod itself can give that nothing runs. Read
    # from watch events (whole objects) only: a listed page is parsed into PodShape.
    stopped: bool = False
    # What its kubelet allocated (pod_allocated), None: nothing reported.
    allocated: Resources | None = None

    @property
    def display_name(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def counted(self) -> Resources:
        """What its requests count, the GPUs its claims allocate (``extended_gpus``) left
        out: with GPU identity on, they are its claims' devices."""
        return replace(self.requests, gpus=0) if self.extended_gpus else self.requests

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def holds(self) -> bool:
        """Bound and not finished: what the ledger must count."""
        return bool(self.node) and not self.terminal


def containers_stopped(status: Mapping[str, Any]) -> bool:
    """Every container the status reports (init, sidecar, app, ephemeral) terminated, and it
    reports some: a pod without statuses may have containers the kubelet never reported."""
    statuses = [
        s
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
        for s in status.get(key) or []
    ]
    return bool(statuses) and all("terminated" in (s.get("state") or {}) for s in statuses)


def pod_info(pod: Mapping[str, Any], gpu_resource: str = GPU_RESOURCE) -> PodInfo:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName") or None
    requests = pod_requests(pod, gpu_resource)
    refs = pod_claims(pod)
    extended = extended_claim(pod) if refs else None
    # Namespaces, node names and phases repeat across thousands of pods: one copy each.
    return PodInfo(
        uid=str(meta.get("uid", "")),
        namespace=sys.intern(str(meta.get("namespace", ""))),
        name=str(meta.get("name", "")),
        node=sys.intern(str(node)) if node else None,
        phase=sys.intern(str(status.get("phase") or "Pending")),
        requests=requests,
        claims=bool((pod.get("spec") or {}).get("resourceClaims")) or extended is not None,
        claim_refs=refs,
        extended_gpus=extended is not None and gpu_resource in extended.resources,
        stopped=containers_stopped(status),
        allocated=pod_allocated(pod, gpu_resource, requests),
    )


@dataclass(frozen=True, slots=True)
class Resize:
    """A held pod's holding as its requests change in place: ``now`` is held at once,
    ``target`` once the growth between them is admitted."""

    now: Resources
    target: Resources

    @property
    def growth(self) -> Resources:
        return self.target - self.now


def resize(held: Resources, wanted: Resources, allocated: Resources | None) -> Resize:
    """The holding of a pod held ``held`` whose requests count ``wanted`` and whose kubelet
    allocated ``allocated`` (None: nothing reported):
    - never below what the kubelet allocated, which the pod may use now, admitted or not;
    - a shrink at once, down to that;
    - a growth beyond both only once admitted (as any admission, confirmed by Slurm):
      until then the larger of the old holding and the kubelet's allocation;
    - GPUs never shrink in place: the API server resizes only CPU and memory, and a
      holding's GPUs may be its claims' devices, which its requests do not count."""
    floor = allocated or Resources.ZERO
    target = _max(wanted, floor)
    target = replace(target, gpus=max(target.gpus, held.gpus))
    return Resize(_min(_max(held, floor), target), target)
