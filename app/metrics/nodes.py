"""The ledger as gauges, per node and for the cluster, read at scrape time.

A scrape reads the ledger at most once per ``cache_seconds``, whatever the number of
scrapers: from the node snapshot's memory when it runs, else every node with its holdings
summed by kind in the database (at 15,000 nodes and 150,000 pods, loading the holdings
themselves took seconds and ~300 MB).
Amounts are in base units: CPU in cores (millicores / 1000), memory in bytes, GPUs as a
count. ``free`` is capacity - reserved - held and is negative on an overcommitted node;
``admissible_capacity`` is what a pod could still get: free on an admissible node, else 0.
The Kubernetes headroom (app.core.headroom): ``headroom_target`` is what is kept withheld
from Slurm beyond what is held, ``headroom_granted`` what Slurm was confirmed to withhold
(holdings included); the cluster's ``headroom_free`` sums what of each node's grant pods
and reservations leave (at least 0 per node). All 0 while the headroom is off.
Per-node series (``per_node``) cost 8 per node and resource plus one per node; the cluster
totals are always there.
``node_gpu_device_holder`` (per node) says which holder has which GPU device:
1 for each device a holding names, labelled with the node, the device's index and the
holder; one series per device held by identity at most (a node's GPUs), none for GPUs held
by count. Read from holdings, so only from the node snapshot's views (an integration on,
the only case in which devices are held through Slurm), not from the database's totals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError

from app.core.decision import admissible as admits
from app.core.headroom import free as headroom_free
from app.core.records import NO_HEADROOM, NodeTotals, NodeView
from app.core.resources import Resources
from app.db.engine import is_outage

log = logging.getLogger(__name__)

HOLDERS = ("kubernetes", "slurm", "manual")


# Every node with what each kind of holder holds: Ledger.node_totals sums it in the
# database, NodeSnapshot.list_nodes has it in memory (a view has its totals too).
ReadNodes = Callable[[], Iterable[NodeView | NodeTotals]]


def base_units(resources: Resources) -> dict[str, float]:
    """cpu in cores, memory in bytes, gpu as a count."""
    return {
        "cpu": resources.cpu_millis / 1000,
        "memory": float(resources.memory_bytes),
        "gpu": float(resources.gpus),
    }


def held_by_holder(view: NodeView | NodeTotals) -> dict[str, Resources]:
    return {
        "kubernetes": view.held_by_kubernetes,
        "slurm": view.held_by_slurm,
        "manual": view.held_manually,
    }


@dataclass
class _Families:
    """Every family the collector exposes, filled from one ledger read."""

    per_node: bool
    node_capacity: GaugeMetricFamily = field(init=False)
    node_held: GaugeMetricFamily = field(init=False)
    node_free: GaugeMetricFamily = field(init=False)
    node_admissible_capacity: GaugeMetricFamily = field(init=False)
    node_admissible: GaugeMetricFamily = field(init=False)
    node_headroom_target: GaugeMetricFamily = field(init=False)
    node_headroom_granted: GaugeMetricFamily = field(init=False)
    gpu_device_holder: GaugeMetricFamily = field(init=False)
    cluster_capacity: GaugeMetricFamily = field(init=False)
    cluster_held: GaugeMetricFamily = field(init=False)
    cluster_free: GaugeMetricFamily = field(init=False)
    cluster_headroom_target: GaugeMetricFamily = field(init=False)
    cluster_headroom_granted: GaugeMetricFamily = field(init=False)
    cluster_headroom_free: GaugeMetricFamily = field(init=False)
    nodes: GaugeMetricFamily = field(init=False)
    nodes_overcommitted: GaugeMetricFamily = field(init=False)

    def __post_init__(self) -> None:
        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"nodeledger_{name}", doc, labels=labels)

        unit = " (cpu: cores, memory: bytes, gpu: count)"
        self.node_capacity = gauge("node_capacity", "Node capacity" + unit, ["node", "resource"])
        self.node_held = gauge(
            "node_held", "Held on the node, by holder" + unit, ["node", "resource", "holder"]
        )
        self.node_free = gauge(
            "node_free",
            "Capacity - reserved - held; negative when overcommitted" + unit,
            ["node", "resource"],
        )
        self.node_admissible_capacity = gauge(
            "node_admissible_capacity",
            "What a pod could still get: free if the node is admissible, else 0" + unit,
            ["node", "resource"],
        )
        self.node_admissible = gauge(
            "node_admissible", "1 when the node admits new holdings", ["node"]
        )
        self.node_headroom_target = gauge(
            "node_headroom_target",
            "Kubernetes headroom kept withheld from Slurm beyond what is held" + unit,
            ["node", "resource"],
        )
        self.node_headroom_granted = gauge(
            "node_headroom_granted",
            "What Slurm was confirmed to withhold for Kubernetes, holdings included" + unit,
            ["node", "resource"],
        )
        self.gpu_device_holder = gauge(
            "node_gpu_device_holder",
            "1 for each GPU device held by identity, with its holder",
            ["node", "device", "holder_kind", "holder"],
        )
        self.cluster_capacity = gauge("cluster_capacity", "Sum of capacities" + unit, ["resource"])
        self.cluster_held = gauge(
            "cluster_held", "Sum held, by holder" + unit, ["resource", "holder"]
        )
        self.cluster_free = gauge("cluster_free", "Sum of the nodes' free" + unit, ["resource"])
        self.cluster_headroom_target = gauge(
            "cluster_headroom_target", "Sum of the nodes' headroom targets" + unit, ["resource"]
        )
        self.cluster_headroom_granted = gauge(
            "cluster_headroom_granted", "Sum of the nodes' headroom grants" + unit, ["resource"]
        )
        self.cluster_headroom_free = gauge(
            "cluster_headroom_free",
            "Sum of what each node's grant leaves beyond what pods and reservations hold "
            "(at least 0 per node): admissions that need no Slurm call" + unit,
            ["resource"],
        )
        self.nodes = gauge("nodes", "Ledger nodes by admissibility", ["state"])
        self.nodes_overcommitted = gauge(
            "nodes_overcommitted", "Nodes whose holdings exceed capacity minus reserved", []
        )

    def all(self) -> list[Metric]:
        cluster: list[Metric] = [
            self.cluster_capacity,
            self.cluster_held,
            self.cluster_free,
            self.cluster_headroom_target,
            self.cluster_headroom_granted,
            self.cluster_headroom_free,
            self.nodes,
            self.nodes_overcommitted,
        ]
        if not self.per_node:
            return cluster
        nodes: list[Metric] = [
            self.node_capacity,
            self.node_held,
            self.node_free,
            self.node_admissible_capacity,
            self.node_admissible,
            self.node_headroom_target,
            self.node_headroom_granted,
            self.gpu_device_holder,
        ]
        return nodes + cluster

    def fill(self, views: Iterable[NodeView | NodeTotals]) -> None:
        capacity = free = Resources.ZERO
        target = granted = headroom = Resources.ZERO
        held = dict.fromkeys(HOLDERS, Resources.ZERO)
        count = admissible = overcommitted = 0
        for view in views:
            count += 1
            by_holder = held_by_holder(view)
            view_free = view.free
            is_admissible = admits(view)
            capacity += view.spec.capacity
            free += view_free
            for holder, resources in by_holder.items():
                held[holder] += resources
            if view.headroom is not NO_HEADROOM:  # the headroom off: nothing to add
                target += view.headroom.target
                granted += view.headroom.granted
                headroom += headroom_free(view).at_least_zero()
            admissible += is_admissible
            overcommitted += not view_free.is_nonnegative()
            if self.per_node:
                self._node(view, by_holder, view_free, is_admissible)
        for resource, amount in base_units(capacity).items():
            self.cluster_capacity.add_metric([resource], amount)
        for holder, total in held.items():
            for resource, amount in base_units(total).items():
                self.cluster_held.add_metric([resource, holder], amount)
        for resource, amount in base_units(free).items():
            self.cluster_free.add_metric([resource], amount)
        for family, total in (
            (self.cluster_headroom_target, target),
            (self.cluster_headroom_granted, granted),
            (self.cluster_headroom_free, headroom),
        ):
            for resource, amount in base_units(total).items():
                family.add_metric([resource], amount)
        self.nodes.add_metric(["admissible"], admissible)
        self.nodes.add_metric(["not_admissible"], count - admissible)
        self.nodes_overcommitted.add_metric([], overcommitted)

    def _node(
        self,
        view: NodeView | NodeTotals,
        by_holder: dict[str, Resources],
        free: Resources,
        admissible: bool,
    ) -> None:
        name = view.name
        for resource, amount in base_units(view.spec.capacity).items():
            self.node_capacity.add_metric([name, resource], amount)
        for holder, resources in by_holder.items():
            for resource, amount in base_units(resources).items():
                self.node_held.add_metric([name, resource, holder], amount)
        for resource, amount in base_units(free).items():
            self.node_free.add_metric([name, resource], amount)
            self.node_admissible_capacity.add_metric(
                [name, resource], max(amount, 0.0) if admissible else 0.0
            )
        self.node_admissible.add_metric([name], 1.0 if admissible else 0.0)
        for resource, amount in base_units(view.headroom.target).items():
            self.node_headroom_target.add_metric([name, resource], amount)
        for resource, amount in base_units(view.headroom.granted).items():
            self.node_headroom_granted.add_metric([name, resource], amount)
        if isinstance(view, NodeView):  # totals carry no holdings, so no devices
            for holding in view.holdings:
                who = holding.holder
                labels = [who.kind.value, who.display_name or who.id]
                for device in holding.device_indices:
                    self.gpu_device_holder.add_metric([name, str(device), *labels], 1.0)


class LedgerCollector:
    """A prometheus-client collector over ``read_nodes()`` (the ledger's node totals, or
    the node snapshot's views when it runs) with a short cache."""

    def __init__(
        self,
        read_nodes: ReadNodes,
        *,
        per_node: bool = True,
        cache_seconds: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.read_nodes = read_nodes
        self.per_node = per_node
        self.cache_seconds = cache_seconds
        self.monotonic = monotonic
        self._lock = threading.Lock()  # concurrent scrapes wait for one read
        self._cached: list[Metric] | None = None
        self._read_at = 0.0

    def describe(self) -> Iterable[Metric]:
        return _Families(self.per_node).all()

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            now = self.monotonic()
            if self._cached is None or now - self._read_at >= self.cache_seconds:
                self._cached = self._read()
                self._read_at = now
            return self._cached

    def _read(self) -> list[Metric]:
        try:
            views = self.read_nodes()
        except SQLAlchemyError as exc:
            # The other metrics still scrape; the ledger's series are absent until it answers.
            # An outage of the database is logged when it starts and ends (app.outages).
            log.log(
                logging.DEBUG if is_outage(exc) else logging.WARNING,
                "metrics: cannot read the ledger: %s",
                exc,
            )
            return []
        families = _Families(self.per_node)
        families.fill(views)
        return families.all()
