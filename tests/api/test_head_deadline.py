"""The deadline on a request's head (app.protocol) holds for a pipelined request too: its
head may arrive while the previous response is still being made, and must still end."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from app.protocol import HeadDeadlineProtocol
from tests.support.net import free_port

SLOW = 2.0  # the first response takes this long
HEAD = 0.5  # the head deadline
KEEP_ALIVE = 60  # uvicorn's own idle timeout: far beyond any deadline this test accepts


async def slow_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await asyncio.sleep(SLOW)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        slow_app,
        host="127.0.0.1",
        port=port,
        http=HeadDeadlineProtocol.with_timeout(HEAD),
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE,
        lifespan="off",
    )
    serving = uvicorn.Server(config)
    thread = threading.Thread(target=serving.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not serving.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    serving.should_exit = True
    thread.join(timeout=10)


def test_a_pipelined_head_behind_a_slow_response_still_times_out(server: int) -> None:
    sock = socket.create_connection(("127.0.0.1", server), timeout=2 * KEEP_ALIVE)
    started = time.monotonic()
    # One whole request, then the first line of a second one that never finishes.
    sock.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\nGET /next HTTP/1.1\r\nhost: x\r\n")
    received = b""
    while chunk := sock.recv(65536):  # returns b"" when the server closes
        received += chunk
    waited = time.monotonic() - started
    sock.close()
    assert received.startswith(b"HTTP/1.1 200 "), received[:100]
    assert received.count(b"HTTP/1.1") == 1  # the second head never completed: no answer
    # Without the deadline only the keep-alive timeout would end it (SLOW + KEEP_ALIVE):
    # the bound between is generous for a loaded machine and still tells the two apart.
    assert SLOW <= waited < SLOW + KEEP_ALIVE / 3, waited
