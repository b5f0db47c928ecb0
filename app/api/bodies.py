"""Request bodies that Python's JSON parser accepts but nothing after it can handle.

A JSON string may escape half of a UTF-16 surrogate pair ("\\ud800"); ``json.loads``
returns it as a lone surrogate, which is not Unicode text: no database stores it and no
answer that echoes it (a 422 quoting the input, a node name sent back by the extender) can
be encoded. RFC 8259 leaves such strings' behaviour undefined; here they are refused at
the edge, before any route, with the 422 of any other invalid JSON.
"""

from __future__ import annotations

import json
import re

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A \uD800-\uDFFF escape; only bodies that have one are parsed here.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def has_lone_surrogate(body: bytes) -> bool:
    if not _SURROGATE_ESCAPE.search(body):
        return False
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return False  # not JSON at all: the route's parser answers that
    try:
        json.dumps(document, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


class RefuseLoneSurrogates:
    """ASGI middleware: 422 for a body with a lone surrogate, else the body passes on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay(message, receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if has_lone_surrogate(body):
            error = {"type": "json_invalid", "loc": ["body"], "msg": "JSON decode error"}
            reason = {"error": "a lone surrogate escape (not Unicode text)"}
            answer = JSONResponse({"detail": [{**error, "input": {}, "ctx": reason}]}, 422)
            await answer(scope, receive, send)
            return
        await self.app(scope, _replay({"type": "http.request", "body": body}, receive), send)


def _replay(first: Message, receive: Receive) -> Receive:
    """``receive`` that answers ``first`` once, then defers to the original."""
    pending = [first]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay
