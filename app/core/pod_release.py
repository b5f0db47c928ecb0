"""When a pod's holding may go: only on proof that its containers have stopped.

A pod object deleted from the API says nothing about its containers when its kubelet is
lost: an operator's ``kubectl delete --force``, or the pod GC after the out-of-service
taint, removes the object while the containers may still run on the unreachable node. So
a pod gone from the API is released only with a proof, named in the release event:

- ``pod-terminal``: its last known phase was Succeeded or Failed;
- ``containers-stopped``: its last known status had every container terminated;
- ``node-deleted``: its Node is gone (deleted, or out of the node selector);
- ``out-of-service-taint``: its Node carries ``node.kubernetes.io/out-of-service``, an
  operator's word that the node is shut down;
- ``pod-deleted-node-ready``: deleted while its node was Ready (the kubelet stops, or
  stopped, what runs there: how it always was);
- ``kubelet-returned``: its holding was kept (an orphaned holding) and the node became
  Ready again: a returning kubelet kills the containers of pods that are gone from the API.

A pod deleted while its node is NotReady or Unknown, with none of these, keeps its holding.
A pod still in the API holds, whatever its node's state (a pod stuck Terminating on a Ready
node holds until its kubelet confirms). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


class Proof(StrEnum):
    POD_TERMINAL = "pod-terminal"
    CONTAINERS_STOPPED = "containers-stopped"
    NODE_DELETED = "node-deleted"
    OUT_OF_SERVICE = "out-of-service-taint"
    POD_DELETED_NODE_READY = "pod-deleted-node-ready"
    KUBELET_RETURNED = "kubelet-returned"


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """What the release rule needs of a Node that exists."""

    ready: bool  # the Ready condition is True, or not reported (yet)
    out_of_service: bool = False  # tainted node.kubernetes.io/out-of-service


READY = NodeHealth(ready=True)


def release_proof(
    *,
    gone: bool,
    terminal: bool,
    stopped: bool,
    node: NodeHealth | None,
    orphaned: bool = False,
) -> Proof | None:
    """The proof that lets a pod's holding go, or None: it stays.

    ``gone``: the pod object is gone from the API (or not listed); ``terminal`` and
    ``stopped``: its last known phase was Succeeded/Failed, every container of its last
    known status was terminated; ``node``: its Node's state, None when the Node is gone;
    ``orphaned``: its holding was kept already when the pod went (only names the proof)."""
    if terminal:
        return Proof.POD_TERMINAL
    if not gone:
        return None  # it holds, Terminating or not, whatever its node's state
    if stopped:
        return Proof.CONTAINERS_STOPPED
    if node is None:
        return Proof.NODE_DELETED
    if node.out_of_service:
        return Proof.OUT_OF_SERVICE
    if node.ready:
        return Proof.KUBELET_RETURNED if orphaned else Proof.POD_DELETED_NODE_READY
    return None
