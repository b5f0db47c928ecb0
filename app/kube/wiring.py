"""Builds the Kubernetes controllers into the service when enabled."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.main import Services
    from app.settings import Settings


def attach_kube(services: Services, settings: Settings) -> None:
    """Append the Kubernetes controllers to services.components (when enabled)."""
    if not settings.kube.enabled:
        return
    raise NotImplementedError("Kubernetes integration is not built yet")
