"""What Kubernetes must see held on a node beyond its pods: a placeholder pod. Pure.

With placeholders on, kube-scheduler filters nodes with its own plugins and calls the
service only to bind, which admits through the ledger (Slurm-confirmed). For its filter
to agree with the ledger, each node where the ledger keeps something from pods
carries one pod of the service's, bound to it, whose CPU and memory requests are what the
ledger keeps from pods there beyond the pods themselves: Slurm's jobs, manual holdings,
the reservation, the Kubernetes cap. The scheduler's room on the node (the Node's
allocatable - its pods - the placeholder) is then the ledger's room for a pod, never more.
A stale or missing placeholder costs a refused bind, which the scheduler retries; it never
oversubscribes a node, since every bind is still an admission.

A node the ledger admits nothing on (a Slurm drain, down or failure, a cordon) gets all of
it: its Node's taint (app.kube.controllers.maintenance) may be off, or still on its way, and
the scheduler would otherwise offer it every pod of a burst, each bind refused. GPUs are not
in the size: a pod's extended resources cannot be resized in place, so the chart keeps the
extender's filter for pods requesting the GPU resource, and DRA devices Slurm holds are
tainted (app.kube.controllers.device_taints).
"""

from __future__ import annotations

import hashlib
from typing import Any

from app.core.caps import KubeCaps
from app.core.records import NodeView
from app.core.resources import Resources

NAME_PREFIX = "nodeledger-held-"
LABEL = "nodeledger.io/placeholder"  # value "true"; the node is the pod's spec.nodeName
CONTAINER = "held"
MAX_NAME = 253  # a pod's name is a DNS subdomain
# On a Node whose placeholder the API server keeps refusing: the chart's scheduler keeps off
# it (its profile's node affinity), as its room there is not known to be the ledger's.
REFUSED_LABEL = "nodeledger.io/placeholder-refused"
# Pod Security "restricted" (and any policy modelled on it): the pause image's own user.
NONROOT = 65535


def room(view: NodeView, caps: KubeCaps | None) -> Resources:
    """What one more pod may take on the node per the ledger: free, under the cap; none
    while the node admits nothing."""
    if view.not_admissible_reason is not None:
        return Resources.ZERO
    free = view.free
    return free if caps is None else free.at_most(caps.room(view))


def size(view: NodeView, node_allocatable: Resources, caps: KubeCaps | None) -> Resources:
    """The placeholder's requests on a node whose Node has ``node_allocatable``: CPU and
    memory, each at least zero; no GPUs. Zero: no placeholder is needed.

    On a node that admits nothing, never below what the ledger holds for others than pods
    (Slurm's jobs, manual holdings): there allocatable - pods falls by whatever the pods'
    holdings grow (a pod recorded as its kubelet runs it may overcommit the node), and a
    kubelet applies a deferred in-place resize onto what that frees (up to the Node's
    allocatable: a pod larger than that no kubelet runs). A node that admits leaves the
    kubelet its free room, which keeps them already."""
    withheld = node_allocatable - view.held_by_kubernetes - room(view, caps)
    if view.not_admissible_reason is not None:
        others = (view.held - view.held_by_kubernetes).at_most(node_allocatable)
        withheld = Resources(
            max(withheld.cpu_millis, others.cpu_millis),
            max(withheld.memory_bytes, others.memory_bytes),
        )
    return Resources(max(0, withheld.cpu_millis), max(0, withheld.memory_bytes), 0)


def pod_name(node: str) -> str:
    """The node's placeholder pod; a name too long keeps a hash of the node's."""
    name = NAME_PREFIX + node
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:12]
    return f"{name[: MAX_NAME - 13].rstrip('.-')}-{digest}"


def is_placeholder(namespace: str, name: str, node: str | None, placeholders: str) -> bool:
    """Whether a pod is a placeholder of the service's (in ``placeholders``, its namespace):
    pod accounting leaves them out, they are the ledger's own holdings seen from Kubernetes."""
    return namespace == placeholders and node is not None and name == pod_name(node)


def resources(amount: Resources) -> dict[str, dict[str, str]]:
    """Limits equal to requests: a LimitRange's default or maximum limit, or a policy that
    requires limits, has nothing to add or refuse, and the pod never grows past its size."""
    quantities = {"cpu": f"{amount.cpu_millis}m", "memory": str(amount.memory_bytes)}
    return {"requests": quantities, "limits": dict(quantities)}


def pod(
    node: str,
    node_uid: str,
    amount: Resources,
    *,
    namespace: str,
    image: str,
    priority_class: str = "",
) -> dict[str, Any]:
    """The placeholder pod of ``node`` holding ``amount``.

    Bound at creation (no scheduler), tolerating every taint (it stands for holdings that
    stay through a drain), resizable in place without a restart, and owned by its Node:
    `kubectl drain` evicts it like any managed pod (a pod without a controller stops a
    drain), and deleting the Node deletes it. Its shape passes Pod Security "restricted"
    (non-root, no privilege escalation, no capability, the runtime's seccomp profile) and
    is the one the chart's ValidatingAdmissionPolicy lets the service create: the default
    ServiceAccount without its token, no volume, no host namespace, only ``image``."""
    spec: dict[str, Any] = {
        "nodeName": node,
        "tolerations": [{"operator": "Exists"}],
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NONROOT,
            "runAsGroup": NONROOT,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "resources": resources(amount),
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "resizePolicy": [
                    {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                    {"resourceName": "memory", "restartPolicy": "NotRequired"},
                ],
            }
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    meta: dict[str, Any] = {
        "name": pod_name(node),
        "namespace": namespace,
        "labels": {LABEL: "true", "app.kubernetes.io/managed-by": "nodeledger"},
    }
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
             "controller": True}
        ]  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def resize(amount: Resources) -> dict[str, Any]:
    """The strategic-merge patch of the pod's ``resize`` subresource to ``amount``."""
    container = {"name": CONTAINER, "resources": resources(amount)}
    return {"spec": {"containers": [container]}}
