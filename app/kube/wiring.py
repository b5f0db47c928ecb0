"""The Kubernetes integration's parts, built from its settings (called by app.bootstrap)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.admission.service import Admissions
from app.core.caps import KubeCaps
from app.core.components import Health
from app.kube.claims import PodDevices
from app.kube.client import KubeClient
from app.kube.controllers import KubeControllers
from app.kube.controllers.device_taints import HoldsOf, SlurmJobs
from app.kube.controllers.discovery import SlurmSizes
from app.kube.controllers.maintenance import DrainPort
from app.kube.extender.service import Extender
from app.kube.settings import KubeSettings
from app.ledger.service import Clock
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import Metrics
from app.outages import Dependency


@dataclass(frozen=True, slots=True)
class KubeParts:
    controllers: KubeControllers
    extender: Extender


def build_kube(
    settings: KubeSettings,
    admissions: Admissions,
    views: NodeSnapshot,
    caps: KubeCaps | None,
    slurm_sizes: SlurmSizes,
    slurm_health: Callable[[], Health | None],
    slurm_jobs: SlurmJobs,
    slurm_holds: HoldsOf,
    metrics: Metrics,
    availability: Dependency,
    clock: Clock,
    drains: DrainPort | None = None,
) -> KubeParts:
    """The controllers (discovery, pod accounting, GenericNodes, status mirror) and the
    scheduler extender. ``slurm_sizes``, ``slurm_health``: a Slurm node's size and the Slurm
    sync's health, None without the Slurm integration (app.bootstrap reads them from it);
    ``slurm_jobs``: the Slurm sync's jobs by node (None while not read: app.bootstrap),
    ``slurm_holds`` which of them are the ledger's hold jobs;
    ``drains``: the Slurm side of a cordon, None without it."""
    client = KubeClient(
        settings.kubeconfig,
        timeout=settings.request_timeout,
        page_size=settings.list_page_size,
        availability=availability,
    )

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
        slurm_jobs=slurm_jobs,
        slurm_holds=slurm_holds,
        metrics=metrics,
        devices=devices,
        drains=drains,
        caps=caps,
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
