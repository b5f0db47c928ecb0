"""The Kubernetes integration's parts, built from its settings (called by app.bootstrap)."""

from __future__ import annotations

from dataclasses import dataclass

from app.admission.service import Admissions
from app.core.caps import KubeCaps
from app.core.components import Health
from app.core.resources import Resources
from app.kube.claims import PodDevices
from app.kube.client import KubeClient
from app.kube.controllers import KubeControllers
from app.kube.controllers.maintenance import SlurmDrains
from app.kube.extender.service import Extender
from app.kube.settings import KubeSettings
from app.ledger.service import Clock
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import Metrics
from app.outages import Dependency
from app.slurm.sync import SlurmSync


@dataclass(frozen=True, slots=True)
class KubeParts:
    controllers: KubeControllers
    extender: Extender


def build_kube(
    settings: KubeSettings,
    admissions: Admissions,
    views: NodeSnapshot,
    caps: KubeCaps | None,
    slurm: SlurmSync | None,
    metrics: Metrics,
    availability: Dependency,
    clock: Clock,
    drains: SlurmDrains | None = None,
) -> KubeParts:
    """The controllers (discovery, pod accounting, GenericNodes, status mirror) and the
    scheduler extender. ``slurm``: the Slurm sync, for node sizes and health, if on."""
    client = KubeClient(
        settings.kubeconfig,
        timeout=settings.request_timeout,
        page_size=settings.list_page_size,
        availability=availability,
    )

    def slurm_sizes(name: str) -> Resources | None:
        return slurm.state.snapshot().node_size(name) if slurm is not None else None

    def slurm_health() -> Health | None:
        return slurm.health() if slurm is not None else None

    devices = (
        PodDevices(client, settings.gpu_driver_names, settings.gpu_index_attribute)
        if settings.gpu_driver_names
        else None
    )
    controllers = KubeControllers(
        settings,
        client,
        admissions,
        slurm_sizes,
        slurm_health,
        clock,
        views,
        metrics=metrics,
        devices=devices,
        drains=drains,
    )
    extender = Extender(
        admissions,
        client,
        caps,
        gpu_resource=settings.gpu_resource,
        snapshot=views,
        max_staleness=settings.extender_max_staleness,
        devices=devices,
    )
    return KubeParts(controllers, extender)
