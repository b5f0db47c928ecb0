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
    )
    app.state.services = services
    app.state.settings = settings
    errors.install(
        app, max_body_bytes=settings.max_body_bytes, body_timeout=settings.request_timeout_seconds
    )
    auth.install(app, guard)
    routes_metrics.install(app)
    for module in (routes_health, routes_nodes, routes_admissions, routes_slurm, web_routes):
        app.include_router(module.router)
    # Routers whose reads are guarded here rather than route by route.
    app.include_router(routes_events.router, dependencies=[auth.require_read("list", "events")])
    app.include_router(extender_routes.router, dependencies=[auth.require_read("get", "nodes")])
    return app
