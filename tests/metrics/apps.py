"""An application on a real SQLite ledger whose admissions a Slurm gate confirms against a
fake slurmrestd (the real SlurmGate and Pusher), with the ledger collector's cache off."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi.testclient import TestClient

from app.admission.service import AdmissionGate
from app.bootstrap import Services, build_services
from app.core.caps import KubeCaps
from app.ledger.service import Ledger
from app.main import create_app
from app.metrics.registry import Metrics
from app.metrics.settings import MetricsSettings
from app.settings import Settings
from app.slurm.gate import SlurmGate
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from tests.support.fake_slurm import FlakySlurm, slurm_node

NODE_N1 = {"capacity": {"cpu": "16", "memory": "32000Mi", "gpu": 0}}


@dataclass
class App:
    api: TestClient
    services: Services
    slurm: FlakySlurm


MakeApp = Callable[..., App]


def start_app(
    sqlite_url: str,
    *,
    gated: bool = True,
    caps: KubeCaps | None = None,
    per_node: bool = True,
    gate: AdmissionGate | None = None,
) -> App:
    """A started app (the caller exits ``api``) with node n1 (16 CPUs, 32000 MiB), whose
    admissions ``gate`` confirms, else (``gated``) a SlurmGate over the fake slurmrestd."""
    settings = Settings(
        database_url=sqlite_url,
        migrate_on_start=False,
        metrics=MetricsSettings(per_node=per_node, cache_seconds=0),
    )
    slurm = FlakySlurm(slurm_node())

    def build_gate(ledger: Ledger, metrics: Metrics) -> AdmissionGate | None:
        if gate is not None or not gated:
            return gate
        pusher = Pusher(slurm, ledger, metrics=metrics)  # type: ignore[arg-type]
        return SlurmGate(pusher, caps or KubeCaps(), holds=HoldJobs(slurm))  # type: ignore[arg-type]

    services = build_services(settings, gate=build_gate)
    api = TestClient(create_app(settings, services)).__enter__()
    api.put("/v1/nodes/n1", json=NODE_N1).raise_for_status()
    return App(api, services, slurm)
