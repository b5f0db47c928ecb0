"""Time and bytes of every kube-scheduler extender call, by verb
(nodeledger_extender_request_duration_seconds, nodeledger_extender_bytes_total): the
extender's share of a scheduling cycle, seen at the service's edge. Pure ASGI, so the
calls it does not count (every other route) pass with one comparison."""

from __future__ import annotations

import time
from typing import get_args

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.metrics.registry import ExtenderVerb, Metrics

PREFIX = "/v1/extender/"
VERBS: dict[str, ExtenderVerb] = {verb: verb for verb in get_args(ExtenderVerb)}


class ExtenderMetering:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        verb = VERBS.get(path[len(PREFIX) :]) if path.startswith(PREFIX) else None
        if scope["type"] != "http" or verb is None:
            await self.app(scope, receive, send)
            return
        counted = [0, 0]  # received, sent

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                counted[0] += len(message.get("body", b""))
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.body":
                counted[1] += len(message.get("body", b""))
            await send(message)

        started = time.perf_counter()
        try:
            await self.app(scope, receiving, sending)
        finally:
            seconds = time.perf_counter() - started
            self.metrics.extender_called(verb, seconds, counted[0], counted[1])
