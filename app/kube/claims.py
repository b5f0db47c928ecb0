"""A pod's co-managed GPU devices, read from the Kubernetes API: its
ResourceClaims' allocations and the node's ResourceSlices (resource.k8s.io/v1), decided by
app.core.claims. Used by the extender's bind, before the pod is bound, and by pod
accounting for a claim pod another scheduler bound."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from app.core.claims import (
    AllocatedDevice,
    ClaimDevicesError,
    ClaimRef,
    allocated_devices,
    pod_claims,
)
from app.core.pods import PodInfo
from app.kube.client import KubeClient, KubeError


class PodDevices:
    """Reads a pod's allocated devices of ``drivers`` (the co-managed DRA drivers), their
    indices from the device attribute ``attribute``. No drivers: nothing is read."""

    def __init__(self, client: KubeClient, drivers: Collection[str], attribute: str) -> None:
        self.client = client
        self.drivers = frozenset(drivers)
        self.attribute = attribute

    @property
    def enabled(self) -> bool:
        return bool(self.drivers)

    def of(self, pod: Mapping[str, Any], node: str) -> tuple[AllocatedDevice, ...]:
        """The pod's allocated co-managed devices on ``node``: () when the feature is off or
        the pod has no claims (no API call then). ClaimDevicesError, naming the claim, for
        anything that keeps them from being known, a failed API read included."""
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        return self.of_claims(namespace, pod_claims(pod), node)

    def count(self, pod: PodInfo) -> int:
        """How many co-managed GPUs a bound pod's claims hold on its node (pod accounting, for
        a pod another scheduler bound: its requests count none). ClaimDevicesError as ``of``."""
        if pod.node is None:
            return 0
        return len(self.of_claims(pod.namespace, pod.claim_refs, pod.node))

    def of_claims(
        self, namespace: str, refs: Sequence[ClaimRef], node: str
    ) -> tuple[AllocatedDevice, ...]:
        if not self.enabled or not refs:
            return ()
        claims: list[dict[str, Any]] = []
        for ref in refs:
            if ref.claim is None:
                reason = "generated from a template, not created yet"
                raise ClaimDevicesError(f"{namespace}/<{ref.entry}>", reason, retryable=True)
            name = f"{namespace}/{ref.claim}"
            try:
                claims.append(self.client.resource_claim(namespace, ref.claim))
            except KubeError as exc:
                raise ClaimDevicesError(name, f"not read: {exc}", retryable=True) from exc
        # Claims all allocated, none by a co-managed driver (a NIC, an FPGA): no slice to
        # read. An unallocated claim is refused below (allocated_devices).
        allocated = all((c.get("status") or {}).get("allocation") for c in claims)
        if allocated and not any(_allocates(claim, self.drivers) for claim in claims):
            return ()
        try:
            slices = self.client.resource_slices(node, self.drivers)
        except KubeError as exc:
            # The claim whose device is to be looked up: the first of a co-managed driver.
            claim = next((c for c in claims if _allocates(c, self.drivers)), claims[0])
            meta = claim.get("metadata") or {}
            name = f"{meta.get('namespace', namespace)}/{meta.get('name', '')}"
            reason = f"node {node!r}'s ResourceSlices not read: {exc}"
            raise ClaimDevicesError(name, reason, retryable=True) from exc
        return allocated_devices(
            claims, slices, node=node, drivers=self.drivers, attribute=self.attribute
        )


def _allocates(claim: Mapping[str, Any], drivers: Collection[str]) -> bool:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(r.get("driver") in drivers for r in results)
