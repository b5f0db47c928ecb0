"""Kubernetes Nodes (matching the selector) become ledger nodes with a GenericNode each.

Capacity is the smaller of the Node's allocatable and Slurm's size of its Slurm node (the
node's `slurm_node_label`, else the same name), because both schedulers must fit; with
co-managed DRA drivers (NODELEDGER_KUBE_GPU_DRIVERS) GPUs are published in ResourceSlices,
not as the extended resource, and a node's GPUs are Slurm's (docs/gpu-identity.md). Nodes
that disappear leave the ledger (or are cordoned while something still holds on them),
and their GenericNodes are garbage-collected.

Of a Node only its name, Slurm alias, allocatable, cordon, readiness and out-of-service
taint are kept (``NodeInfo``): a real Node object carries its image list and conditions,
tens of KB each at 15,000 nodes. Pod accounting is told when a Node's readiness or
out-of-service taint changes, or the Node goes, before the ledger lets go of it: a pod
deleted while its node was lost keeps its holding until then (app.core.pod_release).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypedDict

from app.core.genericnode import MANAGED_BY, new_object
from app.core.ledger_errors import LedgerError, NodeInUse, NodeNotFound
from app.core.pod_release import OUT_OF_SERVICE_TAINT, READY, NodeHealth
from app.core.quantities import Rounding, cpu_millis, gpu_count, memory_bytes
from app.core.records import NodeSpec, NodeView
from app.core.resources import Resources
from app.kube.client import GENERICNODES, KubeClient, KubeError
from app.ledger.service import Ledger

log = logging.getLogger(__name__)
DISCOVERED = "nodeledger.io/discovered"

SlurmSizes = Callable[[str], Resources | None]


def allocatable(node: dict[str, Any], gpu_resource: str) -> Resources:
    values = (node.get("status") or {}).get("allocatable") or {}
    return Resources(
        cpu_millis(values.get("cpu", 0), Rounding.DOWN),
        memory_bytes(values.get("memory", 0), Rounding.DOWN),
        gpu_count(values.get(gpu_resource, 0)),
    )


class _Meta(TypedDict, total=False):
    name: str
    uid: str
    labels: dict[str, str]


class _Condition(TypedDict, total=False):
    type: str
    status: str


class _Status(TypedDict, total=False):
    allocatable: dict[str, Any]
    conditions: list[_Condition]


class _Taint(TypedDict, total=False):
    key: str


class _Spec(TypedDict, total=False):
    unschedulable: bool
    taints: list[_Taint]


class NodeShape(TypedDict, total=False):
    """The fields of a Node that discovery reads (a LIST parses only these)."""

    metadata: _Meta
    spec: _Spec
    status: _Status


class _Named(TypedDict, total=False):
    metadata: _Meta


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What discovery needs of a Kubernetes Node."""

    name: str
    alias: str | None  # the Slurm node named by the label, if any
    allocatable: Resources
    cordoned: bool = False  # spec.unschedulable (kubectl cordon, kubectl drain)
    health: NodeHealth = READY
    uid: str = ""


class NodeRef(NamedTuple):
    """A managed Node as its placeholder pod needs it (app.kube.controllers.placeholders)."""

    allocatable: Resources  # as kube-scheduler reads it
    uid: str  # the placeholder pod's owner


def node_health(obj: dict[str, Any]) -> NodeHealth:
    """Ready unless its Ready condition says False or Unknown: a Node no kubelet reported
    yet has none (the node lifecycle controller sets Unknown if none comes)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = all(c.get("status") == "True" for c in conditions if c.get("type") == "Ready")
    taints = (obj.get("spec") or {}).get("taints") or []
    return NodeHealth(ready, any(t.get("key") == OUT_OF_SERVICE_TAINT for t in taints))


def smaller(a: Resources, b: Resources | None) -> Resources:
    if b is None:
        return a
    return Resources(
        min(a.cpu_millis, b.cpu_millis), min(a.memory_bytes, b.memory_bytes), min(a.gpus, b.gpus)
    )


class NodeDiscovery:
    def __init__(
        self,
        ledger: Ledger,
        client: KubeClient,
        slurm_sizes: SlurmSizes,
        *,
        slurm_node_label: str,
        cluster_name: str,
        gpu_resource: str,
        gpus_from_slurm: bool = False,
    ) -> None:
        self.ledger = ledger
        self.gpus_from_slurm = gpus_from_slurm
        self.client = client
        self.slurm_sizes = slurm_sizes
        self.slurm_node_label = slurm_node_label
        self.cluster_name = cluster_name
        self.gpu_resource = gpu_resource
        self._nodes: dict[str, NodeInfo] = {}
        self._lock = threading.Lock()
        self._applied: dict[str, tuple[Resources, str | None]] = {}  # what the ledger has
        self._genericnodes: set[str] = set()  # names known to have a GenericNode
        # Told the Nodes whose cordon changed (app.kube.controllers.maintenance).
        self.cordons_changed: Callable[[list[str]], None] = lambda names: None
        # Told the Nodes whose health changed or that went (app.kube.controllers.accounting).
        self.health_changed: Callable[[list[str]], None] = lambda names: None
        # Told of Nodes that came, went or changed allocatable (the placeholder pods).
        self.sizes_changed: Callable[[list[str]], None] = lambda names: None

    def managed(self, name: str) -> bool:
        with self._lock:
            return name in self._nodes

    def cordoned(self, name: str) -> bool:
        with self._lock:
            node = self._nodes.get(name)
        return node is not None and node.cordoned

    def health(self, name: str) -> NodeHealth | None:
        """None: no such managed Node (deleted, or it left the selector)."""
        with self._lock:
            node = self._nodes.get(name)
        return None if node is None else node.health

    def node_ref(self, name: str) -> NodeRef | None:
        """None: no such managed Node."""
        with self._lock:
            node = self._nodes.get(name)
        return None if node is None else NodeRef(node.allocatable, node.uid)

    # WatchHandler[NodeInfo]
    shape = NodeShape

    def decode(self, obj: dict[str, Any]) -> NodeInfo:
        meta = obj["metadata"]
        alias = (meta.get("labels") or {}).get(self.slurm_node_label) or None
        cordoned = bool((obj.get("spec") or {}).get("unschedulable"))
        return NodeInfo(
            meta["name"], alias, allocatable(obj, self.gpu_resource), cordoned,
            node_health(obj), str(meta.get("uid", "")),
        )  # fmt: skip

    def key(self, node: NodeInfo) -> str:
        return node.name

    def resync(self, items: list[NodeInfo]) -> None:
        nodes = {n.name: n for n in items}
        with self._lock:
            gone = [name for name in self._nodes if name not in nodes]
            self._nodes = nodes
        self.cordons_changed([n.name for n in items])
        self.health_changed([n.name for n in items] + gone)
        self.sizes_changed([n.name for n in items] + gone)
        # A resync re-checks everything against the ledger, read once (not node by node).
        specs = self.ledger.node_specs()
        self._applied = {name: (s.capacity, s.slurm_name) for name, s in specs.items()}
        selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
        names, _ = self.client.list(GENERICNODES, _name, _Named, labelSelector=selector)
        self._genericnodes = set(names)
        self.refresh()
        self._remove_gone(specs)

    def on_event(self, kind: str, node: NodeInfo) -> None:
        with self._lock:
            before = self._nodes.get(node.name)
            if kind == "DELETED":
                self._nodes.pop(node.name, None)
            else:
                self._nodes[node.name] = node
        if kind != "DELETED" and (before is None or before.cordoned != node.cordoned):
            self.cordons_changed([node.name])
        if before is None or kind == "DELETED" or before.allocatable != node.allocatable:
            self.sizes_changed([node.name])
        if kind == "DELETED" or (before is not None and before.health != node.health):
            self.health_changed([node.name])  # before the ledger lets go of a deleted one
        if kind == "DELETED":
            self._remove(node.name)
        else:
            self._ensure(node)

    def refresh(self) -> None:
        """Apply every known Node again (Slurm's sizes may have arrived meanwhile)."""
        with self._lock:
            nodes = list(self._nodes.values())
        for node in nodes:
            self._ensure(node)

    def _spec(self, node: NodeInfo) -> NodeSpec:
        size = self.slurm_sizes(node.alias or node.name)
        allocatable = node.allocatable
        if self.gpus_from_slurm and size is not None:
            allocatable = replace(allocatable, gpus=size.gpus)  # DRA: not in allocatable
        capacity = smaller(allocatable, size)
        return NodeSpec(
            capacity=capacity,
            slurm_name=node.alias if node.alias != node.name else None,
            labels={DISCOVERED: "true"},
        )

    def _ensure(self, node: NodeInfo) -> None:
        name = node.name
        spec = self._spec(node)
        key = (spec.capacity, spec.slurm_name)
        if self._applied.get(name) == key and name in self._genericnodes:
            return  # nothing changed: no database or API call (refresh runs every few s)
        try:
            current: NodeView | None = self.ledger.get_node(name)
        except NodeNotFound:
            current = None
        if current is None or (current.spec.capacity, current.spec.slurm_name) != key:
            merged = NodeSpec(
                spec.capacity,
                current.spec.reserved if current else Resources.ZERO,
                spec.slurm_name,
                {**(current.spec.labels if current else {}), **spec.labels},
            )
            cordon = current.cordon_reason if current else None
            current, _ = self.ledger.upsert_node(name, merged, cordon_reason=cordon, force=True)
        self._applied[name] = key
        if name not in self._genericnodes:
            try:
                self.client.request(
                    "POST", GENERICNODES, body=new_object(current, self.cluster_name)
                )
            except KubeError as exc:
                if exc.status != 409:  # 409: it exists already
                    raise
            self._genericnodes.add(name)

    def _remove(self, name: str) -> None:
        self._applied.pop(name, None)
        self._genericnodes.discard(name)
        try:
            self._forget(name)
        except LedgerError as exc:
            # One node the ledger will not let go of must not stop the others (a raise here
            # would relist, and meet it again): say so, and go on with its GenericNode.
            log.warning("the Kubernetes Node %s is gone, but the ledger keeps it: %s", name, exc)
        try:
            self.client.request("DELETE", f"{GENERICNODES}/{name}")
        except KubeError as exc:
            if exc.status != 404:
                raise

    def _forget(self, name: str) -> None:
        """The ledger's side of a deleted Node: delete it, or cordon it while something
        holds on it; a node the ledger does not have is forgotten already."""
        try:
            self.ledger.delete_node(name)
        except NodeInUse:
            self.ledger.upsert_node(
                name,
                self.ledger.get_node(name).spec,
                cordon_reason="the Kubernetes Node was deleted",
                force=True,
            )
        except NodeNotFound:
            pass

    def _remove_gone(self, specs: dict[str, NodeSpec]) -> None:
        with self._lock:
            present = set(self._nodes)
        for name, spec in specs.items():
            if spec.labels.get(DISCOVERED) == "true" and name not in present:
                self._remove(name)
        for name in self._genericnodes - present:
            self._remove(name)


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])
