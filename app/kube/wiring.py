"""Builds the Kubernetes controllers and the scheduler extender into the service."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components import Health
from app.kube.binder import Extender
from app.kube.client import KubeClient
from app.kube.controllers import KubeControllers
from app.ledger.resources import Resources

if TYPE_CHECKING:
    from app.ledger.service import Clock
    from app.main import Services
    from app.settings import Settings


def attach_kube(services: Services, settings: Settings, clock: Clock) -> None:
    """Append the controllers to services.components and install the extender."""
    kube = settings.kube
    if not kube.enabled:
        return
    client = KubeClient(
        kube.kubeconfig,
        timeout=kube.request_timeout,
        page_size=kube.list_page_size,
        availability=services.dependency("kubernetes"),
    )
    slurm = services.slurm

    def slurm_sizes(name: str) -> Resources | None:
        return slurm.node_size(name) if slurm is not None else None

    def slurm_health() -> Health | None:
        return slurm.health() if slurm is not None else None

    services.components.append(
        KubeControllers(
            kube,
            client,
            services.admissions,
            slurm_sizes,
            slurm_health,
            clock,
            services.snapshot,
            metrics=services.metrics,
        )
    )
    services.extender = Extender(
        services.admissions,
        client,
        services.kube_caps,
        gpu_resource=kube.gpu_resource,
        snapshot=services.snapshot,
        max_staleness=kube.extender_max_staleness,
    )
