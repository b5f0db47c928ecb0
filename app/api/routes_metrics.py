"""``GET /metrics`` (the app's own registry, in the format the scraper asks for) and the
request-id middleware.

A request's id is its ``X-Request-ID`` header when that is a sane token (at most 128 of
letters, digits and ``._:-``), else a new one; it is on every log line of the request
(app.logs) and sent back in the response's ``X-Request-ID``.
"""

from __future__ import annotations

import gzip
import re
import secrets

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client.exposition import choose_encoder
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth.guard import require_read
from app.core.errors import NodeledgerError
from app.logs import log_context
from app.metrics.registry import Metrics

HEADER = "X-Request-ID"
_VALID_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

router = APIRouter(tags=["metrics"])


class MetricsDisabled(NodeledgerError):
    """/metrics on a service built without a registry."""

    code = "metrics_disabled"
    http_status = 404


# A sync route: collecting may read the ledger, so it runs in the thread pool. Guarded like
# the node reads it reveals (open unless NODELEDGER_AUTH_PROTECT_READS).
@router.get("/metrics", include_in_schema=False, dependencies=[require_read("list", "nodes")])
def scrape(request: Request) -> Response:
    metrics: Metrics = request.app.state.services.metrics
    if metrics.registry is None:
        raise MetricsDisabled("this service collects no metrics")
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    body = encode(metrics.registry)
    if "gzip" in request.headers.get("accept-encoding", ""):
        compressed = gzip.compress(body, compresslevel=5)
        return Response(compressed, media_type=content_type, headers={"Content-Encoding": "gzip"})
    return Response(body, media_type=content_type)


def request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            given: str = value.decode("latin-1")
            if _VALID_ID.fullmatch(given):
                return given
    return secrets.token_hex(16)


class RequestIdMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware: it would cost the admission path a task hop)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        with log_context(request_id=rid):
            await self.app(scope, receive, send_with_id)


def install(app: FastAPI) -> None:
    """Give every request an id (``router`` serves /metrics)."""
    app.add_middleware(RequestIdMiddleware)
