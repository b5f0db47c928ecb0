"""An application's services with a scheduler extender but no Kubernetes API: for tests
whose calls never get as far as one (filter, prioritize, refused bodies), or that bring a
fake of their own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from app.bootstrap import Services
from app.core.caps import KubeCaps
from app.kube.client import KubeClient
from app.kube.extender.service import Extender


def offline_extender(
    services: Services, caps: KubeCaps | None = None, *, kube: Any = None, **options: Any
) -> Services:
    """``services`` with an Extender whose Kubernetes client is ``kube`` (absent unless
    given)."""
    extender = Extender(
        services.admissions,
        cast(KubeClient, kube),
        caps,
        gpu_resource="nvidia.com/gpu",
        snapshot=services.snapshot,
        **options,
    )
    return replace(services, extender=extender)
