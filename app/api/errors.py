"""Domain errors to HTTP, in one place."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.exceptions import HTTPException

from app.api.bodies import RefuseLoneSurrogates
from app.api.schemas import ErrorOut, ShortfallOut
from app.ledger import errors

log = logging.getLogger(__name__)

STATUS = {
    errors.NodeNotFound: 404,
    errors.HoldingNotFound: 404,
    errors.AdmissionRejected: 409,
    errors.HolderConflict: 409,
    errors.NodeInUse: 409,
    errors.CapacityBelowHoldings: 409,
    errors.InvalidRequest: 422,
}


def status_of(exc: errors.LedgerError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def error_response(exc: errors.LedgerError) -> JSONResponse:
    body = ErrorOut(
        detail=exc.message,
        code=exc.code,
        retryable=exc.retryable,
        shortfalls=[ShortfallOut.of(s) for s in getattr(exc, "shortfalls", ())],
    )
    return JSONResponse(body.model_dump(), status_code=status_of(exc))


def unparsable_body(cause: BaseException) -> JSONResponse:
    """422 for a body that is not JSON at all, in the shape of every other invalid input."""
    reason = "not valid UTF-8" if isinstance(cause, UnicodeDecodeError) else "nested too deep"
    error = {"type": "json_invalid", "loc": ["body"], "msg": "JSON decode error", "input": {}}
    return JSONResponse({"detail": [{**error, "ctx": {"error": reason}}]}, status_code=422)


def install(app: FastAPI) -> None:
    app.add_middleware(RefuseLoneSurrogates)

    @app.exception_handler(errors.LedgerError)
    async def _ledger_error(_request: Request, exc: errors.LedgerError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        # FastAPI turns a JSON syntax error into a 422 naming the body, but a body that is not
        # text (invalid UTF-8) or nests past the parser's recursion limit into a bare 400
        # raised from the parser's error: answer those like any other invalid JSON.
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError | RecursionError):
            return unparsable_body(cause)
        return await http_exception_handler(request, exc)

    @app.exception_handler(DBAPIError)
    async def _database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        # A lost or refused connection (database restarted, failing over): the caller may
        # retry, and the pool reconnects by itself. Anything else is a bug: let it be a 500.
        if not (isinstance(exc, OperationalError) or exc.connection_invalidated):
            raise exc
        log.error("database unavailable during %s %s: %s", request.method, request.url.path, exc)
        body = ErrorOut(
            detail="database unavailable, try again", code="database_unavailable", retryable=True
        )
        return JSONResponse(body.model_dump(), status_code=503)
