"""Errors to HTTP, in one place: every NodeledgerError (app.core.errors) a route raises is
answered here with its own status, code and retryable, in the one shape of ErrorOut; so
are the framework's refusals (invalid input, an unparsable body) and a database outage.
The OpenAPI document lists the answers that no route declares itself: the body guard's
408/413 and the auth guard's 401/403/503."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic.json_schema import models_json_schema
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException

from app.api.answers import error_response
from app.api.bodies import BodyGuard
from app.api.schemas import ErrorOut
from app.auth.guard import document_refusals
from app.core.errors import NodeledgerError
from app.core.ledger_errors import InvalidRequest
from app.db.engine import is_outage

log = logging.getLogger(__name__)
MAX_ERRORS = 20  # listed in a 422; the count says how many there were
MAX_QUOTED = 200  # characters of an input, a location or a context value quoted back

ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}


class DatabaseUnavailable(NodeledgerError):
    """The database lost or refused the connection (restarted, failing over): the pool
    reconnects by itself."""

    code = "database_unavailable"
    http_status = 503
    retryable = True
    unavailable = True


def unparsable_body(cause: BaseException) -> JSONResponse:
    """422 for a body that is not JSON at all, in the shape of every other invalid input."""
    reason = "not valid UTF-8" if isinstance(cause, UnicodeDecodeError) else "nested too deep"
    error = {"type": "json_invalid", "loc": ["body"], "msg": "JSON decode error", "input": {}}
    return invalid_input([{**error, "ctx": {"error": reason}}])


def _short(text: str) -> str:
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "..."


def _quotable(value: Any) -> tuple[bool, Any]:
    """(True, value as quoted back) for a short scalar; (False, None) for anything else: a
    422 never echoes a large or unencodable input (NaN, a megabyte of a list)."""
    if value is None or isinstance(value, bool):
        return True, value
    if isinstance(value, int):
        return (True, value) if abs(value) < 2**64 else (False, None)
    if isinstance(value, float):
        return (True, value) if math.isfinite(value) else (False, None)
    if isinstance(value, str):
        return True, _short(value)
    return False, None


def _error_item(error: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": str(error.get("type", "value_error")),
        "loc": [p if isinstance(p, int) else _short(str(p)) for p in error.get("loc", ())],
        "msg": _short(str(error.get("msg", ""))),
    }
    quotable, value = _quotable(error.get("input"))
    if quotable:
        item["input"] = value
    if isinstance(error.get("ctx"), dict):
        item["ctx"] = {str(k): _context_value(v) for k, v in error["ctx"].items()}
    return item


def _context_value(value: Any) -> Any:
    quotable, quoted = _quotable(value)
    return quoted if quotable else _short(str(value))


def invalid_input(errors: Sequence[dict[str, Any]]) -> JSONResponse:
    """422 in the house shape: ``detail`` lists the first MAX_ERRORS errors (``loc`` names
    each field), inputs quoted only when short; ``errors`` counts them all."""
    body = {
        "detail": [_error_item(e) for e in errors[:MAX_ERRORS]],
        "code": "invalid_request",
        "retryable": False,
        "errors": len(errors),
    }
    return JSONResponse(body, status_code=422)


BODY_REFUSALS = {
    "408": "The body did not arrive within NODELEDGER_REQUEST_TIMEOUT_SECONDS",
    "413": "The body is larger than NODELEDGER_MAX_BODY_BYTES",
}


def document_body_refusals(document: dict[str, Any]) -> dict[str, Any]:
    """408 and 413 (app.api.bodies) on every operation that takes a body; idempotent."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict) and "requestBody" in operation:
                for status, what in BODY_REFUSALS.items():
                    answer = {"description": what, "content": ERROR_CONTENT}
                    operation.setdefault("responses", {}).setdefault(status, answer)
    return document


def document_error_schema(document: dict[str, Any]) -> dict[str, Any]:
    """ErrorOut (and what it refers to) among the document's schemas, for the refusals no
    route declares; idempotent."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    _, definitions = models_json_schema(
        [(ErrorOut, "serialization")], ref_template="#/components/schemas/{model}"
    )
    for model, definition in definitions.get("$defs", {}).items():
        schemas.setdefault(model, definition)
    return document


def install(app: FastAPI, *, max_body_bytes: int, body_timeout: float) -> None:
    app.add_middleware(BodyGuard, max_bytes=max_body_bytes, timeout=body_timeout)
    generate = app.openapi  # cached by FastAPI until the routes change

    def openapi() -> dict[str, Any]:
        document = document_body_refusals(document_error_schema(generate()))
        return document_refusals(app, document, ERROR_CONTENT)

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid_input(exc.errors())

    @app.exception_handler(NodeledgerError)
    async def _error(_request: Request, exc: NodeledgerError) -> JSONResponse:
        if isinstance(exc, InvalidRequest) and exc.field is not None:
            # Input only the ledger can judge (a GPU device the node lacks): answered as
            # the schema's refusals are, naming the field.
            error = {"type": "value_error", "loc": ["body", exc.field], "msg": exc.message}
            return invalid_input([error])
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
        if not is_outage(exc):
            raise exc
        # The outage itself is logged once, when it starts and ends (app.outages).
        database = request.app.state.services.database
        level = logging.DEBUG if database.down else logging.WARNING
        where = f"{request.method} {request.url.path}"
        log.log(level, "database unavailable during %s: %s", where, exc)
        return error_response(DatabaseUnavailable("database unavailable, try again"))
