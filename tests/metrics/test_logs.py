"""Structured logs: with NODELEDGER_LOG_FORMAT=json every line is a JSON object carrying the
request id (from X-Request-ID, or made up) and, during an admission, the node and holder,
including lines logged from the worker thread the admission runs in."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import httpx
import pytest

from app.cli import _settings, parser
from app.core.records import Holding
from app.logs import JsonFormatter, configure_logging, log_context
from tests.metrics.apps import NODE_N1, MakeApp
from tests.support.service import running_service

log = logging.getLogger("tests.metrics.gate")


class LoggingGate:
    """Agrees with everything, and says so in a log line."""

    def confirm(self, holding: Holding) -> None:
        log.info("confirming %s", holding.holder.display_name)

    def changed(self, node: str) -> None:
        log.info("told about a change")

    def headroom_open(self, node: str) -> bool:
        return False

    def defer_push(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        """No headroom."""


def test_json_lines_carry_request_id_node_and_holder(make_app: MakeApp) -> None:
    app = make_app(gate=LoggingGate())  # runs in a worker thread now
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        given = app.api.post(
            "/v1/admissions",
            json={
                "node": "n1",
                "holder": {"kind": "pod", "namespace": "ns", "name": "web", "uid": "u-1"},
                "requests": {"cpu": "1"},
            },
            headers={"X-Request-ID": "req-42"},
        )
        released = app.api.delete("/v1/admissions/u-1")
    finally:
        log.removeHandler(handler)
    assert given.status_code == 201
    assert given.headers["X-Request-ID"] == "req-42"
    generated = released.headers["X-Request-ID"]
    assert len(generated) == 32

    confirming, changed = (json.loads(line) for line in stream.getvalue().splitlines())
    assert confirming["message"] == "confirming ns/web"
    assert confirming["level"] == "info"
    assert confirming["logger"] == "tests.metrics.gate"
    assert confirming["time"].endswith("+00:00")
    assert (confirming["request_id"], confirming["node"], confirming["holder"]) == (
        "req-42",
        "n1",
        "u-1",
    )
    assert (changed["request_id"], changed["node"], changed["holder"]) == (generated, "n1", "u-1")


@pytest.mark.parametrize(
    "header", ["", "x" * 129, "has space", '{"json": 1}'], ids=["empty", "long", "space", "json"]
)
def test_an_unusable_request_id_is_replaced(make_app: MakeApp, header: str) -> None:
    api = make_app(gated=False).api
    answered = api.get("/healthz", headers={"X-Request-ID": header})
    assert answered.headers["X-Request-ID"] != header
    assert len(answered.headers["X-Request-ID"]) == 32


def test_formatter_fields_context_extra_and_exceptions() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "plain %s", ("line",), None)
    assert json.loads(formatter.format(record)).keys() == {"time", "level", "logger", "message"}
    with log_context(node="n1", request_id="r1"), log_context(holder="h1"):
        record.node = "n7"  # a record's own extra wins
        line = json.loads(formatter.format(record))
    assert (line["node"], line["holder"], line["request_id"]) == ("n7", "h1", "r1")
    try:
        raise ValueError("boom")
    except ValueError:
        error = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), None)
        error.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(formatter.format(error))["exception"]


def test_serve_configures_json_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings(parser().parse_args(["serve", "--log-format", "json"])).log_format == "json"
    monkeypatch.setenv("NODELEDGER_LOG_FORMAT", "json")
    assert _settings(parser().parse_args(["serve"])).log_format == "json"
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    try:
        configure_logging("info", "json")
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        root.handlers, root.level = handlers, level


def test_nodeledger_serve_writes_json_lines(sqlite_url: str, tmp_path: Path) -> None:
    """The real process: its own lines and uvicorn's are JSON, with the request id."""
    env = {"NODELEDGER_LOG_FORMAT": "json", "NODELEDGER_LOG_LEVEL": "debug"}
    with running_service(sqlite_url, tmp_path, env=env) as service:
        headers = {"X-Request-ID": "e2e-7"}
        httpx.put(f"{service.url}/v1/nodes/n1", json=NODE_N1, headers=headers).raise_for_status()
        scraped = httpx.get(f"{service.url}/metrics")
        assert "nodeledger_admissions_total" in scraped.text
    lines = [json.loads(line) for line in service.log().splitlines() if line.strip()]
    assert {"time", "level", "logger", "message"} <= lines[0].keys()
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    access = [line for line in lines if line.get("request_id") == "e2e-7"]
    assert any("PUT /v1/nodes/n1" in line["message"] for line in access)
