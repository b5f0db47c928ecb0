"""Builds the Slurm integration into the service when it is enabled."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.main import Services
    from app.settings import Settings


def attach_slurm(services: Services, settings: Settings) -> None:
    """Install the Slurm admission gate and the sync component (when enabled)."""
    if not settings.slurm.enabled:
        return
    raise NotImplementedError("Slurm integration is not built yet")
