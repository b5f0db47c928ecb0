"""The ASGI application: the routers over the services app.bootstrap builds, which run
for as long as the application does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import __version__
from app.api import (
    errors,
    routes_admissions,
    routes_events,
    routes_health,
    routes_metrics,
    routes_nodes,
    routes_slurm,
)
from app.auth import guard as auth
from app.bootstrap import Services, build_guard, build_services, running
from app.kube.extender import routes as extender_routes
from app.kube.extender.metering import ExtenderMetering
from app.settings import Settings
from app.web import routes as web_routes


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
        with running(services):
            yield

    app = FastAPI(
        title="nodeledger",
        version=__version__,
        summary="Per-node resource ledger shared by Kubernetes pods and Slurm jobs",
        lifespan=lifespan,
        # Prometheus is the service's telemetry (app.metrics). FastAPI's own OpenTelemetry,
        # when on, looks up the global providers on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.services = services
    app.state.settings = settings
    errors.install(
        app, max_body_bytes=settings.max_body_bytes, body_timeout=settings.request_timeout_seconds
    )
    auth.install(app, guard)
    routes_metrics.install(app)
    app.add_middleware(ExtenderMetering, metrics=services.metrics)
    # The routers' routes join the app's own, each with its router's prefix and
    # dependencies: FastAPI 0.16x matches an included router's routes again on every
    # request, a tenth of an admission's time in the service. The busiest come first.
    for router in (
        routes_admissions.router,
        extender_routes.router,
        routes_health.router,
        routes_nodes.router,
        routes_slurm.router,
        routes_events.router,
        routes_metrics.router,
        web_routes.router,
    ):
        app.router.routes.extend(router.routes)
    return app
