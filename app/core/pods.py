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
from collections.abc import Mapping
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
    return _effective(pod.get("spec") or {}, gpu_resource)


def pod_allocated(pod: Mapping[str, Any], gpu_resource: str = GPU_RESOURCE) -> Resources | None:
    """What the pod's kubelet allocated to it, by the rules of ``pod_requests`` over each
    container's status: the larger of what the kubelet admitted (``allocatedResources``)
    and what it applied (``resources.requests``), which differ while a resize is in
    progress; what it reports nothing of counts as the spec asks. None: the kubelet reports
    no allocation (the pod has not started, or the kubelet predates in-place resize)."""
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    reported: dict[str, dict[str, Any]] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(key) or []:
            applied = (entry.get("resources") or {}).get("requests") or {}
            allocated = entry.get("allocatedResources") or {}
            if applied or allocated:
                reported[str(entry.get("name", ""))] = _larger(allocated, applied, gpu_resource)
    if not reported:
        return None

    def as_allocated(containers: list[Any]) -> list[Any]:
        out = []
        for container in containers:
            amounts = reported.get(container.get("name"))
            if amounts is not None:
                resources = container.get("resources") or {}
                asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
                container = {**container, "resources": {"requests": {**asked, **amounts}}}
            out.append(container)
        return out

    allocated_spec = {
        **spec,
        "containers": as_allocated(spec.get("containers") or []),
        "initContainers": as_allocated(spec.get("initContainers") or []),
    }
    return _effective(allocated_spec, gpu_resource)


def _larger(a: Mapping[str, Any], b: Mapping[str, Any], gpu_resource: str) -> dict[str, str]:
    """Two reports of a container's requests as one: the larger amount of each resource
    either names (as requests again)."""
    amounts = _max(_amounts(a, gpu_resource), _amounts(b, gpu_resource))
    larger = {"cpu": f"{amounts.cpu_millis}m", "memory": str(amounts.memory_bytes)}
    if amounts.gpus:
        larger[gpu_resource] = str(amounts.gpus)
    return {name: amount for name, amount in larger.items() if name in a or name in b}


def _effective(spec: Mapping[str, Any], gpu_resource: str) -> Resources:
    sidecars = Resources.ZERO
    init_peak = Resources.ZERO
    for container in spec.get("initContainers") or []:
        amounts = _container(container, gpu_resource)
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + amounts
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, sidecars + amounts)
    apps = Resources.total([_container(c, gpu_resource) for c in spec.get("containers") or []])
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
    # requests do not count may be the claims' devices, which the extender's bind admits
    # (issue 23), or pod accounting counts.
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
    refs = pod_claims(pod)
    extended = extended_claim(pod) if refs else None
    # Namespaces, node names and phases repeat across thousands of pods: one copy each.
    return PodInfo(
        uid=str(meta.get("uid", "")),
        namespace=sys.intern(str(meta.get("namespace", ""))),
        name=str(meta.get("name", "")),
        node=sys.intern(str(node)) if node else None,
        phase=sys.intern(str(status.get("phase") or "Pending")),
        requests=pod_requests(pod, gpu_resource),
        claims=bool((pod.get("spec") or {}).get("resourceClaims")) or extended is not None,
        claim_refs=refs,
        extended_gpus=extended is not None and gpu_resource in extended.resources,
        stopped=containers_stopped(status),
        allocated=pod_allocated(pod, gpu_resource),
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
