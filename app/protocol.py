"""uvicorn's HTTP/1.1 protocol with a deadline on each request's head.

uvicorn times out only idle keep-alive connections: a client that connects and sends
nothing, or a request line and half its headers, keeps its connection (and a file
descriptor) for ever. Here the head of every request (from the connection, or from the
first byte of the next request) must arrive within ``head_timeout`` seconds, else the
connection is closed without an answer, as uvicorn closes an idle keep-alive one. The body
has its own deadline (app.api.bodies).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadDeadlineProtocol(HttpToolsProtocol):
    head_timeout: ClassVar[float] = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    @classmethod
    def with_timeout(cls, seconds: float) -> type[HeadDeadlineProtocol]:
        """This class with another deadline (uvicorn takes a class, not an instance)."""
        return type(cls.__name__, (cls,), {"head_timeout": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request's head came behind a response still being made: its
            # deadline starts again (else only uvicorn's keep-alive timeout would end it).
            self._arm()
            return
        self.transport.close()
