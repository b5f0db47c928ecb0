"""Hostile and careless bodies (issue #19), on every route that reads one: numbers JSON has
no word for (NaN, Infinity, 1e400, integers of thousands of digits), nesting deeper than
any Kubernetes object, bodies past the size limit, bodies that never finish.

Every one answers a 4xx in the house shape (``code``, ``retryable``) naming the field or
the limit: never a 5xx, never an echo of a large input. In-process on both databases,
except the slow and huge bodies, which go through the real `nodeledger serve` (uvicorn's
own reading of the socket is part of what is tested).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.bootstrap import build_services
from app.main import create_app
from app.settings import Settings
from tests.support.databases import sqlite_database
from tests.support.extender import offline_extender
from tests.support.service import ServiceProcess, running_service

LIMIT = 64 * 1024  # the body limit of these tests (the default is 1 MiB)
NODE = {"capacity": {"cpu": "8", "memory": "16Gi", "gpu": 1}, "labels": {"rack": "r1"}}
POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
}
KUBE_NODE = {"metadata": {"name": "n1", "labels": {"a": "b"}}, "status": {"capacity": {"cpu": 8}}}
# (method, path, a valid body): every route with a body.
ROUTES = [
    ("PUT", "/v1/nodes/n2", {**NODE, "reserved": {"cpu": 1}, "cordon_reason": "maintenance"}),
    (
        "POST",
        "/v1/admissions",
        {
            "node": "n1",
            "holder": {"kind": "pod", "uid": "u-2", "namespace": "ns", "name": "p"},
            "requests": {"cpu": "1", "memory": 1024, "gpu": 0},
        },
    ),
    ("POST", "/v1/extender/filter", {"Pod": POD, "NodeNames": ["n1", "n9"]}),
    ("POST", "/v1/extender/filter", {"Pod": POD, "Nodes": {"items": [KUBE_NODE]}}),
    ("POST", "/v1/extender/prioritize", {"Pod": POD, "NodeNames": ["n1"]}),
    (
        "POST",
        "/v1/extender/bind",
        {"PodName": "p", "PodNamespace": "ns", "PodUID": "u-1", "Node": "n1"},
    ),
    ("POST", "/v1/slurm/job-hints", {"job_ids": [1, 2]}),
]
ROUTE_IDS = [f"{m} {p}" + (" Nodes" if "Nodes" in b else "") for m, p, b in ROUTES]
# Tokens Python's json module reads as numbers, though JSON has no such number.
NUMBERS = {
    "NaN": b"NaN",
    "Infinity": b"Infinity",
    "-Infinity": b"-Infinity",
    "1e400": b"1e400",
    "-1e400": b"-1e400",
    "400-digit float": b"1" * 400 + b".5",
    "5000-digit integer": b"7" * 5000,
}
MARK = "\x00hostile\x00"
JSON_HEADERS = {"content-type": "application/json"}


def app_with_extender(database_url: str, **options: Any) -> Any:
    """The extender routes answer; nothing here gets as far as the Kubernetes API."""
    settings = Settings(database_url=database_url, migrate_on_start=False, **options)
    return create_app(settings, offline_extender(build_services(settings)))


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    app = app_with_extender(database_url, max_body_bytes=LIMIT)
    with TestClient(app) as client:
        assert client.put("/v1/nodes/n1", json=NODE).status_code == 201
        yield client


def places(document: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every value's path in ``document``, containers and leaves."""
    if path:
        yield path
    if isinstance(document, dict):
        for key, value in document.items():
            yield from places(value, (*path, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from places(value, (*path, index))


def replaced(document: Any, path: tuple[str | int, ...], raw: bytes) -> bytes:
    """The document as JSON with the value at ``path`` written as ``raw``."""
    copy = json.loads(json.dumps(document))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = MARK
    text = json.dumps(copy).encode()
    marker = json.dumps(MARK).encode()
    assert text.count(marker) == 1
    return text.replace(marker, raw)


def assert_refused(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text[:500]
    body: dict[str, Any] = answer.json()
    assert body["code"] == code, body
    assert body["retryable"] is False, body
    return body


@st.composite
def hostile_numbers(draw: st.DrawFn) -> tuple[str, str, tuple[str | int, ...], bytes]:
    method, path, body = draw(st.sampled_from(ROUTES))
    where = draw(st.sampled_from(list(places(body))))
    token = draw(st.sampled_from(sorted(NUMBERS)))
    return method, path, where, replaced(body, where, NUMBERS[token])


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=hostile_numbers())
def test_numbers_json_has_no_word_for_are_a_422_naming_the_field(
    client: TestClient, case: tuple[str, str, tuple[str | int, ...], bytes]
) -> None:
    method, path, where, body = case
    answer = client.request(method, path, content=body, headers=JSON_HEADERS)
    refused = assert_refused(answer, 422, "invalid_request")
    assert ["body", *where] in [e["loc"] for e in refused["detail"]], refused


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize("depth", [65, 254, 256, 900, 5000])
def test_nesting_deeper_than_any_object_is_a_422(
    client: TestClient, method: str, path: str, body: dict[str, Any], depth: int
) -> None:
    # Deep inside the place kube-scheduler's objects are passed through untouched.
    where = next(p for p in places(body) if not isinstance(p[-1], int))
    raw = b"[" * depth + b"]" * depth
    answer = client.request(method, path, content=replaced(body, where, raw), headers=JSON_HEADERS)
    refused = assert_refused(answer, 422, "invalid_request")
    assert "64 levels" in refused["detail"][0]["msg"], refused
    assert len(answer.content) < 2048


def test_a_node_item_256_levels_deep_is_refused_not_echoed(client: TestClient) -> None:
    # The scheduler's Nodes are echoed back: at 256 levels the echo could not be written.
    deep: Any = "x"
    for _ in range(256):
        deep = [deep]
    node = {**KUBE_NODE, "spec": {"deep": deep}}
    answer = client.post("/v1/extender/filter", json={"Pod": POD, "Nodes": {"items": [node]}})
    assert_refused(answer, 422, "invalid_request")


def test_the_words_themselves_in_strings_pass(client: TestClient) -> None:
    labels = {"NaN": "Infinity", "e": "1e400", "7" * 310: "-Infinity"}
    answer = client.put("/v1/nodes/n3", json={**NODE, "labels": labels})
    assert answer.status_code == 201, answer.text
    assert answer.json()["labels"] == labels


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_body_past_the_limit_is_a_413_naming_it(
    client: TestClient, method: str, path: str, body: dict[str, Any], declared: bool
) -> None:
    big = json.dumps({**body, "padding": "x" * LIMIT}).encode()
    content: Any = big if declared else iter([big[i : i + 4096] for i in range(0, len(big), 4096)])
    answer = client.request(method, path, content=content, headers=JSON_HEADERS)
    refused = assert_refused(answer, 413, "body_too_large")
    assert f"{LIMIT} bytes" in refused["detail"]
    assert "NODELEDGER_MAX_BODY_BYTES" in refused["detail"]


def test_a_body_just_under_the_limit_is_served(client: TestClient) -> None:
    names = ["n1"] + [f"n{i:07}" for i in range((LIMIT - 400) // 12)]
    body = json.dumps({"Pod": POD, "NodeNames": names}).encode()
    assert LIMIT - 4096 < len(body) <= LIMIT
    answer = client.post("/v1/extender/filter", content=body, headers=JSON_HEADERS)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["NodeNames"] == ["n1"], answer.json()["FailedNodes"].get("n1")


def test_a_422_quotes_no_large_input(client: TestClient) -> None:
    body = {"job_ids": ["x" * 100] * 600}  # 600 errors, each with a 100-character input
    answer = client.post("/v1/slurm/job-hints", json=body)
    refused = assert_refused(answer, 422, "invalid_request")
    assert len(answer.content) < 16 * 1024, len(answer.content)
    assert refused["detail"][0]["loc"] == ["body", "job_ids", 0]
    assert refused["errors"] == 600


# ---------------------------------------------------------------- the real server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    tmp = tmp_path_factory.mktemp("hostile")
    env = {"NODELEDGER_REQUEST_TIMEOUT_SECONDS": "2", "NODELEDGER_AUTH_MODE": "none"}
    with running_service(sqlite_database(tmp), tmp, env=env) as service:
        yield service


def rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def raw_request(url: str, head: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(head)
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.slow
def test_bodies_that_never_finish_are_answered_408_and_closed(server: ServiceProcess) -> None:
    head = (
        b"POST /v1/extender/filter HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n" + b'{"Pod": {}, "NodeNames": ['
    )
    started = time.monotonic()
    sockets = [raw_request(server.url, head) for _ in range(50)]
    # The service answers others meanwhile.
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    answers = [read_all(s) for s in sockets]  # read_all returns when the server closes
    waited = time.monotonic() - started
    for s in sockets:
        s.close()
    assert waited < 25, waited  # the 2 s deadline, not the socket's 30 s; room for load
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b'"code":"body_too_slow"' in answer
        assert b"NODELEDGER_REQUEST_TIMEOUT_SECONDS" in answer


@pytest.mark.slow
def test_connections_that_never_finish_their_head_are_closed(server: ServiceProcess) -> None:
    heads = [b"", b"POST /v1/admissions HTTP/1.1\r\nhost: x\r\n", b"GET /healthz HTTP/1.1\r\n"]
    started = time.monotonic()
    sockets = [raw_request(server.url, heads[i % len(heads)]) for i in range(60)]
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    answers = [read_all(s) for s in sockets]  # returns when the server closes
    waited = time.monotonic() - started
    for s in sockets:
        s.close()
    assert waited < 25, waited  # the 2 s deadline, not the socket's 30 s; room for load
    assert answers == [b""] * len(sockets)


@pytest.mark.slow
def test_a_56_mb_body_is_refused_at_once_in_bounded_memory(server: ServiceProcess) -> None:
    names = ",".join(f'"n{i}"' for i in range(5_000_000))
    body = f'{{"Pod": {{}}, "NodeNames": [{names}]}}'.encode()
    assert len(body) > 50_000_000
    before = rss_peak_kib(server.process.pid)
    with httpx.Client(timeout=60) as http:
        started = time.monotonic()
        declared = http.post(f"{server.url}/v1/extender/filter", content=body, headers=JSON_HEADERS)
        declared_time = time.monotonic() - started
        chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))
        started = time.monotonic()
        try:
            chunked = http.post(
                f"{server.url}/v1/extender/filter", content=chunks, headers=JSON_HEADERS
            )
            chunked_status = chunked.status_code
        except httpx.TransportError:  # the server answered and closed while we still sent
            chunked_status = 413
        chunked_time = time.monotonic() - started
    grown = rss_peak_kib(server.process.pid) - before
    print(
        f"56 MB body: {declared.status_code} in {declared_time:.2f} s (content-length), "
        f"{chunked_status} in {chunked_time:.2f} s (chunked); peak RSS grew {grown} KiB"
    )
    assert declared.status_code == 413, declared.text[:300]
    assert chunked_status == 413
    assert declared_time < 2
    assert chunked_time < 5
    assert grown < 64 * 1024, grown


def test_the_document_says_every_body_route_may_answer_408_and_413(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    for method, path, _ in ROUTES:
        template = "/v1/nodes/{name}" if path.startswith("/v1/nodes/") else path
        responses = document["paths"][template][method.lower()]["responses"]
        assert {"408", "413"} <= set(responses), (method, path)
