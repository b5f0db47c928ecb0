"""An error as an HTTP answer: the one place the error shape (ErrorOut) is built from a
NodeledgerError, for the routes' error handler (app.api.errors) and for the body guard
(app.api.bodies), which answers before any route runs."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi.responses import JSONResponse

from app.api.schemas import ErrorOut, ShortfallOut
from app.auth.errors import CHALLENGE, Unauthenticated
from app.core.errors import NodeledgerError


def error_response(exc: NodeledgerError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """``exc``'s status, with its message, code, retryable and shortfalls; a 401 carries the
    Bearer challenge, an error with a ``retry_after`` a Retry-After."""
    body = ErrorOut(
        detail=exc.message,
        code=exc.code,
        retryable=exc.retryable,
        shortfalls=[ShortfallOut.of(s) for s in getattr(exc, "shortfalls", ())],
    )
    challenge = CHALLENGE if isinstance(exc, Unauthenticated) else {}
    retry = getattr(exc, "retry_after", None)  # seconds, for a 429 or a 503
    later = {"Retry-After": str(retry)} if retry is not None else {}
    answer = {**challenge, **later, **(headers or {})} or None
    return JSONResponse(body.model_dump(), status_code=exc.http_status, headers=answer)
