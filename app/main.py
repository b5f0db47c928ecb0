"""Builds the application: services from settings, routers, start-up and shutdown."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from app import __version__
from app.admission.service import AdmissionGate, Admissions
from app.api import (
    errors,
    routes_admissions,
    routes_events,
    routes_health,
    routes_nodes,
    routes_slurm,
)
from app.auth import guard as auth
from app.auth.wiring import build_guard
from app.components import Component
from app.core.caps import KubeCaps
from app.db import migrate
from app.db.engine import Database
from app.kube import routes as kube_routes
from app.kube.binder import Extender
from app.kube.wiring import attach_kube
from app.ledger.service import Clock, Ledger, utcnow
from app.ledger.snapshot import NodeSnapshot
from app.metrics import http as metrics_http
from app.metrics.nodes import LedgerCollector
from app.metrics.registry import Metrics
from app.outages import Dependency
from app.settings import Settings
from app.slurm.hints import JobHints
from app.slurm.sync import SlurmSync
from app.slurm.wiring import attach_slurm
from app.web import routes as web_routes

log = logging.getLogger(__name__)


@dataclass
class Services:
    """Everything the routers and background components share, built once."""

    db: Database
    ledger: Ledger
    admissions: Admissions
    snapshot: NodeSnapshot  # every node view, for those that read many (app.ledger.snapshot)
    components: list[Component] = field(default_factory=list)
    slurm: SlurmSync | None = None
    job_hints: JobHints | None = None  # with the Slurm integration on
    extender: Extender | None = None
    kube_caps: KubeCaps | None = None  # Kubernetes' share of a node, with Slurm on (app.core.caps)
    metrics: Metrics = field(default_factory=lambda: Metrics(CollectorRegistry()))
    # What this replica sees of the database, slurmrestd, the Kubernetes API (app.outages).
    dependencies: dict[str, Dependency] = field(default_factory=dict)

    @property
    def database(self) -> Dependency:
        return self.dependencies["database"]

    def dependency(self, name: str) -> Dependency:
        """The named dependency's tracker, made on first use."""
        if name not in self.dependencies:
            self.dependencies[name] = Dependency(name, metrics=self.metrics)
        return self.dependencies[name]


def build_services(
    settings: Settings, *, clock: Clock = utcnow, gate: AdmissionGate | None = None
) -> Services:
    db = Database.from_url(settings.database_url, pool_size=settings.db_pool_size)
    if settings.migrate_on_start:
        migrate.upgrade(db.engine)
    ledger = Ledger(db, clock)
    snapshot = NodeSnapshot(ledger)
    # With an integration on, the snapshot runs for its readers: scrapes read it too.
    integrated = settings.slurm.enabled or settings.kube.enabled
    registry = CollectorRegistry()  # one per app: tests build many apps in one process
    metrics = Metrics(registry)
    per_node, cache = settings.metrics.per_node, settings.metrics.cache_seconds
    registry.register(
        LedgerCollector(
            snapshot.list_nodes if integrated else ledger.node_totals,
            per_node=per_node,
            cache_seconds=cache,
        )
    )
    admissions = Admissions(ledger, gate, metrics=metrics)
    services = Services(db, ledger, admissions, snapshot, metrics=metrics)
    if settings.slurm.enabled:
        slurm = settings.slurm
        services.kube_caps = KubeCaps(slurm.kube_max_cpu_fraction, slurm.kube_max_memory_fraction)
    database = services.dependency("database")
    db.watch(database.failed, database.answered)
    if integrated:
        # Its readers' first component: started before them, stopped after them.
        services.components.append(snapshot)
    attach_slurm(services, settings)
    attach_kube(services, settings, clock)
    return services


def create_app(
    settings: Settings | None = None,
    services: Services | None = None,
    guard: auth.Guard | None = None,
) -> FastAPI:
    settings = settings or Settings()
    services = services or build_services(settings)
    guard = guard or build_guard(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started: list[Component] = []
        try:
            for component in services.components:
                component.start()
                started.append(component)
            yield
        finally:
            for component in reversed(started):
                try:
                    component.stop()
                except Exception:
                    log.exception("stopping %s failed", component.name)
            services.db.dispose()

    app = FastAPI(
        title="nodeledger",
        version=__version__,
        summary="Per-node resource ledger shared by Kubernetes pods and Slurm jobs",
        lifespan=lifespan,
    )
    app.state.services = services
    app.state.settings = settings
    errors.install(
        app, max_body_bytes=settings.max_body_bytes, body_timeout=settings.request_timeout_seconds
    )
    auth.install(app, guard)
    metrics_http.install(app)
    for module in (routes_health, routes_nodes, routes_admissions, routes_slurm, web_routes):
        app.include_router(module.router)
    # Routers whose reads are guarded here rather than route by route.
    app.include_router(routes_events.router, dependencies=[auth.require_read("list", "events")])
    app.include_router(kube_routes.router, dependencies=[auth.require_read("get", "nodes")])
    return app
