"""The scheduler extender wired onto an application's services without a Kubernetes API:
for tests whose calls never get as far as one (filter, prioritize, refused bodies)."""

from __future__ import annotations

from typing import Any, cast

from app.core.caps import KubeCaps
from app.kube.binder import Extender
from app.kube.client import KubeClient


def offline_extender(services: Any, caps: KubeCaps | None = None, **options: Any) -> Extender:
    """Set ``services.extender`` to an Extender whose Kubernetes client is absent; returns it."""
    services.extender = Extender(
        services.admissions,
        cast(KubeClient, None),
        caps,
        gpu_resource="nvidia.com/gpu",
        snapshot=services.snapshot,
        **options,
    )
    return cast(Extender, services.extender)
