from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response
from sqlalchemy.exc import SQLAlchemyError

from app.api.schemas import HealthOut

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


@router.get("/healthz")
def healthz() -> HealthOut:
    """The process is alive."""
    return HealthOut(status="ok")


@router.get("/readyz", responses={503: {"model": HealthOut}})
def readyz(request: Request, response: Response) -> HealthOut:
    """Ready to serve: the database answers. A degraded integration (Slurm unreachable)
    keeps the service ready, because ledger reads still work and admissions fail closed
    with a reason; the body says what is degraded."""
    services = request.app.state.services
    checks: dict[str, str] = {}
    try:
        services.db.ping()
        services.database.answered()  # it may have come back on a pooled connection
        checks["database"] = "ok"
    except SQLAlchemyError as exc:
        # The outage is logged when it starts and ends (app.outages), not at every probe.
        log.debug("readiness: database check failed: %s", exc)
        outage = services.database.status()
        checks["database"] = outage or f"unavailable: {type(exc).__name__}"
        response.status_code = 503
        return HealthOut(status="unavailable", checks=checks)
    degraded = False
    for name, dependency in services.dependencies.items():
        if name != "database" and (outage := dependency.status()) is not None:
            checks[name] = f"degraded: {outage}"
            degraded = True
    for component in services.components:
        health = component.health()
        checks[component.name] = (
            health.message if health.status == "ok" else (f"degraded: {health.message}")
        )
        degraded = degraded or health.status != "ok"
    return HealthOut(status="degraded" if degraded else "ok", checks=checks)
