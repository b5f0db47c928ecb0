"""The Kubernetes side as one service component: while this replica leads, it runs node
discovery, pod accounting, the GenericNode admission-check protocol, the status mirror and
the maintenance of both sides (taints, cordons), each in its own thread; every replica
serves the extender and the REST API."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from app.admission.service import Admissions
from app.core import placeholder
from app.core.caps import KubeCaps
from app.core.components import Health
from app.core.genericnode import MANAGED_BY
from app.core.pods import PodInfo
from app.core.slurm_models import LedgerHolds
from app.kube.claims import PodDevices
from app.kube.client import GENERICNODES, KubeClient, KubeError
from app.kube.controllers.accounting import FIELD_SELECTOR, PodAccounting, Report
from app.kube.controllers.admission_requests import AdmissionRequests
from app.kube.controllers.device_taints import DeviceTaints, HoldsOf, SlurmJobs
from app.kube.controllers.discovery import NodeDiscovery, SlurmSizes
from app.kube.controllers.extended_resources import ExtendedResourceMapping
from app.kube.controllers.leader import LeaderElector
from app.kube.controllers.maintenance import POLL, DrainPort, Maintenance
from app.kube.controllers.mirror import StatusMirror
from app.kube.controllers.placeholders import Placeholders, remove_all
from app.kube.controllers.watch import ListWatch
from app.kube.settings import KubeSettings
from app.ledger.service import Clock
from app.ledger.snapshot import NodeSnapshot
from app.loops import Loop, Stop
from app.metrics.registry import NO_METRICS, Metrics

log = logging.getLogger(__name__)
HOUSEKEEPING_INTERVAL = 1.0
REFRESH_EVERY = 5  # housekeeping rounds between re-applying Node sizes (Slurm's may come later)
STOP_TIMEOUT = 10.0  # seconds to wait for the threads of a term that ends


class KubeControllers:
    name = "kubernetes"

    def __init__(
        self,
        settings: KubeSettings,
        client: KubeClient,
        admissions: Admissions,
        slurm_sizes: SlurmSizes,
        slurm_health: Callable[[], Health | None],
        clock: Clock,
        snapshot: NodeSnapshot,
        *,
        metrics: Metrics = NO_METRICS,
        devices: PodDevices | None = None,
        drains: DrainPort | None = None,
        slurm_jobs: SlurmJobs | None = None,
        slurm_holds: HoldsOf | None = None,
        caps: KubeCaps | None = None,
    ) -> None:
        """``caps``: the Kubernetes cap (None: Slurm is off, no cap), which placeholder pods
        include. ``devices``: reads a pod's co-managed GPU devices from its claims (none: the
        feature is off); ``drains``: drains and resumes Slurm nodes for cordons (none:
        Slurm is off); ``slurm_jobs``: the Slurm sync's jobs by node, for the GPU device
        taints (none: Slurm is off, nothing to taint), ``slurm_holds`` which of them are the
        ledger's hold jobs."""
        ledger = admissions.ledger
        self.metrics = metrics
        metrics.leader("kube-controllers", False)
        self.discovery = NodeDiscovery(
            ledger,
            client,
            slurm_sizes,
            slurm_node_label=settings.slurm_node_label,
            cluster_name=settings.cluster_name,
            gpu_resource=settings.gpu_resource,
            gpus_from_slurm=bool(settings.gpu_driver_names),
        )
        self.client = client
        self.placeholder_namespace = namespace = settings.placeholder_namespace
        self.accounting = accounting = PodAccounting(
            admissions,
            self.discovery.managed,
            gpu_resource=settings.gpu_resource,
            binding_grace=settings.binding_grace,
            clock=clock,
            claim_gpus=devices.count if devices is not None else None,
            node_health=self.discovery.health,
            metrics=metrics,
            ignored=lambda p: placeholder.is_placeholder(p.namespace, p.name, p.node, namespace),
            report=_pod_events(client, clock),
        )
        protocol = AdmissionRequests(
            admissions, client, gpu_resource=settings.gpu_resource, clock=clock
        )
        self.device_taints = DeviceTaints(
            client,
            lambda: {v.slurm_name: v.name for v in snapshot.views(max_age=POLL).values()},
            slurm_jobs or _no_jobs,
            slurm_holds or _no_holds,
            drivers=settings.gpu_driver_names,
            attribute=settings.gpu_index_attribute,
            enabled=settings.gpu_device_taints and slurm_jobs is not None,
            resync_period=settings.resync_period,
        )
        # Plain GPU pods held by device need a DeviceClass mapping their resource: told.
        self.gpu_mapping = (
            ExtendedResourceMapping(
                client, gpu_resource=settings.gpu_resource, resync_period=settings.resync_period
            )
            if devices is not None
            else None
        )
        self.mirror = StatusMirror(
            snapshot,
            client,
            slurm_health,
            qps=settings.status_qps,
            burst=settings.status_burst,
            resync_period=settings.resync_period,
            gpu_resource=settings.gpu_resource,
            clock=clock,
            metrics=metrics,
            tainted=self.device_taints.tainted,
        )
        self.device_taints.changed = self.mirror.mark
        self.maintenance = Maintenance(
            snapshot,
            client,
            self.discovery.managed,
            self.discovery.cordoned,
            drains if settings.cordon_drains_slurm else None,
            clock,
            ledger.record_event,
            slurm_taints=settings.slurm_taints,
            evict=settings.slurm_taints_evict,
            node_selector=settings.node_selector,
            resync_period=settings.resync_period,
            co_managed=drains is not None,  # Slurm integrated: each node has two sides
            metrics=metrics,
        )
        self.placeholders = (
            Placeholders(
                snapshot,
                client,
                self.discovery.node_ref,
                caps,
                namespace=namespace,
                image=settings.placeholder_image,
                priority_class=settings.placeholder_priority_class,
                qps=settings.status_qps,
                burst=settings.status_burst,
                metrics=metrics,
            )
            if settings.placeholders
            else None
        )
        self.discovery.cordons_changed = self.maintenance.mark
        self.discovery.health_changed = accounting.nodes_changed
        managed = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
        period = settings.resync_period
        self.watches: list[ListWatch[Any]] = [
            ListWatch("nodes", client, "/api/v1/nodes", self.discovery, metrics=metrics,
                      resync_period=period, labelSelector=settings.node_selector),
            ListWatch("pods", client, "/api/v1/pods", accounting, metrics=metrics,
                      resync_period=period, fieldSelector=FIELD_SELECTOR),
            ListWatch("genericnodes", client, GENERICNODES, protocol, metrics=metrics,
                      resync_period=period, labelSelector=managed),
        ]  # fmt: skip
        if self.placeholders is not None:
            self.discovery.sizes_changed = self.placeholders.mark
            self.watches.append(
                ListWatch("placeholders", client, f"/api/v1/namespaces/{namespace}/pods",
                          self.placeholders, metrics=metrics, resync_period=period,
                          labelSelector=f"{placeholder.LABEL}=true")
            )  # fmt: skip
        self.elector = (
            LeaderElector(
                client,
                name=settings.lease_name,
                namespace=settings.lease_namespace,
                identity=settings.identity,
                lease_duration=settings.lease_duration,
                on_start=self._lead,
                on_stop=self._follow,
            )
            if settings.leader_election
            else None
        )
        self._stop = Stop()
        self._threads: list[threading.Thread] = []
        self._rounds = 0
        self.housekeeping = Loop(
            "housekeeping",
            self._housekeep,
            interval=HOUSEKEEPING_INTERVAL,
            logger=log,
            what="Kubernetes housekeeping",
            wait_first=True,
        )

    # Component
    def start(self) -> None:
        if self.elector is None:
            self._lead()
        else:
            self.elector.start()

    def stop(self) -> None:
        self._follow()
        if self.elector is not None:
            self.elector.release()

    def health(self) -> Health:
        if not self._threads:
            return Health("ok", "standing by (another replica leads)")
        errors = [w.error for w in self.watches if w.error]
        if self.device_taints.error:
            errors.append(f"GPU device taints: {self.device_taints.error}")
        if self.placeholders is not None and self.placeholders.refusals:
            errors.append(self.placeholders.refusals)
        if errors:
            return Health("degraded", "; ".join(errors))
        waiting = [w.name for w in self.watches if not w.synced.is_set()]
        if waiting:
            return Health("degraded", f"not synced yet: {', '.join(waiting)}")
        notes = [self.device_taints.note, self.gpu_mapping.note if self.gpu_mapping else None]
        return Health("ok", "; ".join(["leading", *(n for n in notes if n)]))

    # leadership
    def _lead(self) -> None:
        self.metrics.leader("kube-controllers", True)
        self._stop = stop = Stop()
        nodes = self.watches[0]
        self._spawn("watch-nodes", lambda: nodes.run(stop))
        self._spawn("start-controllers", lambda: self._after_nodes(stop))

    def _after_nodes(self, stop: Stop) -> None:
        """Nodes first: pods are only accounted on managed nodes, so a pod listed before
        discovery put its node in the ledger would be skipped until the next resync (at
        15,000 new nodes discovery takes minutes)."""
        while not self.watches[0].synced.wait(1.0) and not stop.is_set():
            pass
        if stop.is_set():
            return
        for watch in self.watches[1:]:
            self._spawn(f"watch-{watch.name}", lambda w=watch: w.run(stop))  # type: ignore[misc]
        self._spawn("genericnode-status", lambda: self.mirror.run(stop))
        self._spawn("maintenance", lambda: self.maintenance.run(stop))
        self._spawn("device-taints", lambda: self.device_taints.run(stop))
        if (mapping := self.gpu_mapping) is not None:
            self._spawn("extended-resources", lambda: mapping.run(stop))
        if (placeholders := self.placeholders) is not None:
            self._spawn("placeholders", lambda: placeholders.run(stop))
        else:
            self._spawn("placeholders-off", self._remove_placeholders)
        self._spawn("housekeeping", lambda: self.housekeeping.run(stop))

    def _follow(self) -> None:
        """Stop leading: signal this term's threads and wait for them, so that no thread of
        an old term writes beside a new leader. A watch's stream is shut when signalled
        (app.kube.client); the wait stays bounded for a request under way."""
        self.metrics.leader("kube-controllers", False)
        self._stop.set()
        deadline = time.monotonic() + STOP_TIMEOUT
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if still := [t.name for t in self._threads if t.is_alive()]:
            log.info("threads still stopping after %.0f s: %s", STOP_TIMEOUT, ", ".join(still))
        self._threads = []

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _remove_placeholders(self) -> None:
        try:
            remove_all(self.client, self.placeholder_namespace)
        except KubeError as exc:  # said once; the next term looks again
            log.warning("placeholder pods left from when they were on not removed: %s", exc)

    def _housekeep(self) -> None:
        self._rounds += 1
        self.accounting.sweep()
        if self._rounds % REFRESH_EVERY == 0:
            self.discovery.refresh()


def _no_holds() -> LedgerHolds:
    return LedgerHolds("")


def _pod_events(client: KubeClient, clock: Clock) -> Report:
    """A Warning Event on a pod; a failure to post one is logged, never raised."""

    def report(pod: PodInfo, reason: str, message: str) -> None:
        try:
            client.pod_event(pod.namespace, pod.name, pod.uid, reason, message, clock())
        except KubeError as exc:
            log.warning("event %s on pod %s not posted: %s", reason, pod.display_name, exc)

    return report


def _no_jobs() -> None:
    return None  # Slurm off: never read, so no taint is ever written
