"""Log lines as text (the default) or JSON, with the request id, node and holder they were
written for when known.

The request id, node and holder live in context variables: the request-id middleware
(app.api.routes_metrics) and the admission service set them, and every line logged meanwhile
carries them, including from the worker thread an admission runs in (Starlette copies the
context into it). A record's own ``extra={"node": ...}`` wins over the context. Nothing
here adds a value that was not already in a log line or a header: no token is logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import unquote_plus

LogFormat = Literal["text", "json"]
# The query parameters the API reads (a test keeps this equal to the OpenAPI document's).
# Any other is a caller's mistake and may be a secret (?access_token=...): redacted.
QUERY_SHOWN = frozenset(
    {"after", "cursor", "force", "holder_kind", "kind", "limit", "node", "q", "since", "sort"}
)
REDACTED = "[redacted]"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_request_id: ContextVar[str | None] = ContextVar("nodeledger_request_id", default=None)
_node: ContextVar[str | None] = ContextVar("nodeledger_log_node", default=None)
_holder: ContextVar[str | None] = ContextVar("nodeledger_log_holder", default=None)
CONTEXT = {"node": _node, "holder": _holder, "request_id": _request_id}


@contextmanager
def log_context(
    *, node: str | None = None, holder: str | None = None, request_id: str | None = None
) -> Iterator[None]:
    """Lines logged in the block carry the given values (None: keep the outer one)."""
    given = ((_node, node), (_holder, holder), (_request_id, request_id))
    tokens = [(var, var.set(value)) for var, value in given if value is not None]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, RFC 3339), level, logger, message, and node,
    holder, request_id when known; exception and stack when the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, var in CONTEXT.items():
            value = getattr(record, key, None) or var.get()
            if value is not None:
                line[key] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def redact_query(target: str) -> str:
    """A request target with every query pair that is not the API's own redacted."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    pairs = query.split("&")
    shown = [p if unquote_plus(p.partition("=")[0]) in QUERY_SHOWN else REDACTED for p in pairs]
    return f"{path}?{'&'.join(shown)}"


class RedactQueries(logging.Filter):
    """On uvicorn's access logger (debug only): its lines print the request target
    (``'%s - "%s %s HTTP/%s" %d'``, the target third), query string included."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


# Client libraries that log every request they make (httpx: "HTTP Request: GET ..." at INFO
# for each slurmrestd call); what the service has to say about them it says itself.
LIBRARIES = ("httpx", "httpcore", "urllib3", "kubernetes")


def configure_logging(level: str, log_format: LogFormat, library_level: str = "warning") -> None:
    """The root logger of ``nodeledger serve``: one stderr handler in ``log_format``; the
    client libraries at ``library_level`` (NODELEDGER_LOG_LIBRARY_LEVEL)."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    for library in LIBRARIES:
        logging.getLogger(library).setLevel(library_level.upper())
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQueries) for f in access.filters):
        access.addFilter(RedactQueries())


def uvicorn_log_options(log_format: LogFormat) -> dict[str, Any]:
    """uvicorn's own loggers: its text configuration, or (JSON) none, so that its lines go
    to the root logger's JSON handler."""
    return {"log_config": None} if log_format == "json" else {}
