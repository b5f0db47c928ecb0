"""Request bodies, bounded and checked before any route (and before authentication): the
work an unauthenticated caller can cause must stay small.

- Size: at most ``max_bytes`` (NODELEDGER_MAX_BODY_BYTES); a larger Content-Length is
  refused before reading, a chunked body as soon as it passes the limit (413).
- Time: the whole body within ``timeout`` seconds of the request's start
  (NODELEDGER_REQUEST_TIMEOUT_SECONDS), else 408 and the connection is closed.
- What Python's JSON parser accepts but nothing after it can handle, 422 naming the field:
  ``NaN``, ``Infinity`` and numbers that overflow a double (no answer quoting them can be
  written as JSON); integers past Python's digit limit (the parser fails without saying
  where); a lone surrogate escape (``"\\ud800"``, not Unicode text: no database stores it);
  nesting deeper than ``MAX_DEPTH`` (answers that echo it cannot be serialized).

Only bodies that may hold such a thing are parsed here (cheap byte scans decide), so a
normal admission is parsed once, by its route.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.answers import error_response
from app.core.errors import NodeledgerError

MAX_DEPTH = 64  # Kubernetes objects nest about 15 deep (managedFields included)
# The body may hold a token Python reads as a number JSON has no word for: parse it.
_SUSPECT = re.compile(rb"NaN|Infinity|[0-9]{300}|[eE][+-]?[0-9]{3}|\\u[dD][89a-fA-F]")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]


class _Refused:
    """Stands in for a value the parser read but that must not go further."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a JSON number")


def _float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused("the number is out of range")


def _int(text: str) -> int | _Refused:
    limit = sys.get_int_max_str_digits()
    if limit and len(text.lstrip("-")) > limit:
        return _Refused(f"an integer of more than {limit} digits")
    return int(text)


def nesting_depth(body: bytes) -> int:
    """How deep the JSON document nests (a bound from counting when that suffices)."""
    opened = body.count(b"[") + body.count(b"{")
    if opened <= MAX_DEPTH:
        return opened
    structure = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, structure)), default=0)


def _walk(
    value: Any, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(path, reason) of every refused value and lone surrogate in the parsed document."""
    if isinstance(value, _Refused):
        yield path, value.reason
    elif isinstance(value, str):
        if not value.isascii() and not _encodable(value):
            yield path, "a lone surrogate escape (not Unicode text)"
    elif isinstance(value, dict):
        for key, item in value.items():
            if not key.isascii() and not _encodable(key):
                yield (*path, _printable(key)), "a lone surrogate escape (not Unicode text)"
            yield from _walk(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*path, index))


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode()


def refusal(body: bytes) -> tuple[list[str | int], str] | None:
    """Where (a 422 ``loc``) and why the body is refused, or None: the route decides."""
    if nesting_depth(body) > MAX_DEPTH:
        return ["body"], f"nests deeper than {MAX_DEPTH} levels"
    if not _SUSPECT.search(body):
        return None
    try:
        document = json.loads(body, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except (ValueError, RecursionError):
        return None  # not JSON at all: the route's parser answers that
    for path, reason in _walk(document):
        return ["body", *(_printable(p) if isinstance(p, str) else p for p in path)], reason
    return None


class BodyTooLarge(NodeledgerError):
    code = "body_too_large"
    http_status = 413


class BodyTooSlow(NodeledgerError):
    code = "body_too_slow"
    http_status = 408


def _error(exc: NodeledgerError) -> JSONResponse:
    # Unread body bytes may still arrive: the connection cannot carry another request.
    return error_response(exc, headers={"connection": "close"})


def invalid_body(loc: list[str | int], reason: str) -> JSONResponse:
    """422 in the shape of every other invalid input (app.api.errors)."""
    error = {"type": "json_invalid", "loc": loc, "msg": f"JSON decode error: {reason}"}
    answer = {"detail": [{**error, "ctx": {"error": reason}}]}
    return JSONResponse({**answer, "code": "invalid_request", "retryable": False, "errors": 1}, 422)


class BodyGuard:
    """ASGI middleware: the body read within its limits and checked, then passed on whole."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    def too_large(self) -> JSONResponse:
        return _error(
            BodyTooLarge(
                f"the request body is larger than {self.max_bytes} bytes "
                "(the limit is NODELEDGER_MAX_BODY_BYTES)"
            )
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            # A larger declared body is refused unread (the server checked it is a number).
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self.too_large()(scope, receive, send)
                return
        try:
            async with asyncio.timeout(self.timeout):
                body, last = await self._read(receive)
        except TimeoutError:
            detail = (
                f"the request body did not arrive within {self.timeout:g} s "
                "(the limit is NODELEDGER_REQUEST_TIMEOUT_SECONDS)"
            )
            await _error(BodyTooSlow(detail))(scope, receive, send)
            return
        if body is None:
            await self.too_large()(scope, receive, send)
        elif last["type"] != "http.request":  # the client went away: the app sees it
            await self.app(scope, _replay(last, receive), send)
        elif (refused := refusal(body) if body else None) is not None:
            await invalid_body(*refused)(scope, receive, send)
        else:
            await self.app(scope, _replay({"type": "http.request", "body": body}, receive), send)

    async def _read(self, receive: Receive) -> tuple[bytes | None, Message]:
        """The whole body (None past the limit) and the last message received."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"", message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None, message
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), message


def _replay(first: Message, receive: Receive) -> Receive:
    """``receive`` that answers ``first`` once, then defers to the original."""
    pending = [first]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
