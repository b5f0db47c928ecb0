"""Pod accounting as the tests drive it: pods as the Kubernetes watch gives them (on n1 by
default), and a PodAccounting of node n1 whose Events on pods land in a list."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from app.admission.service import Admissions
from app.core.pods import PodInfo
from app.core.resources import Resources
from app.kube.controllers.accounting import PodAccounting

GIB = 2**30


def pod(uid: str, cpu: int = 1000, node: str | None = "n1", phase: str = "Pending") -> PodInfo:
    return PodInfo(uid, "ns", uid, node, phase, Resources(cpu, GIB))


def running(uid: str, cpu: int, allocated: int | None) -> PodInfo:
    """A pod asking ``cpu`` whose kubelet allocated it ``allocated`` (None: not reported)."""
    amounts = None if allocated is None else Resources(allocated, GIB)
    return replace(pod(uid, cpu, phase="Running"), allocated=amounts)


def reporting(
    admissions: Admissions, clock: Callable[[], datetime], reports: list[tuple[str, str, str]]
) -> PodAccounting:
    """Pod accounting on n1, resynced, its Events in ``reports``: (uid, reason, message)."""
    accounting = PodAccounting(
        admissions, {"n1"}.__contains__, gpu_resource="nvidia.com/gpu", binding_grace=30,
        clock=clock, report=lambda p, reason, message: reports.append((p.uid, reason, message)),
    )  # fmt: skip
    accounting.resync([])
    return accounting
