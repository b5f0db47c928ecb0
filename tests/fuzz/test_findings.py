"""What the schemathesis run (test_schemathesis.py) found, or led to, pinned: each input
here once answered 5xx, or something the OpenAPI document did not describe. In-process,
on both databases (NUL characters and 64-bit ids failed on PostgreSQL only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import build_services
from app.main import create_app
from app.settings import Settings
from tests.support.extender import offline_extender

NODE = {"capacity": {"cpu": "4", "memory": "8Gi"}}
JSON = {"content-type": "application/json"}


def admission(**holder: Any) -> dict[str, Any]:
    return {"node": "n1", "holder": {"kind": "pod", **holder}, "requests": {"cpu": "1"}}


# (method, path, JSON body or raw bytes, where the 422 points)
INVALID = [
    pytest.param("GET", "/v1/events?after=872762672487212873940992", None, ["query", "after"],
                 id="event-cursor-past-64-bits"),
    pytest.param("GET", "/v1/events?since=0001-01-01T00:00:04%2B01:00", None, ["query", "since"],
                 id="since-before-year-1-in-utc"),
    pytest.param("GET", "/v1/events?since=2026-01-01T00:00:00", None, ["query", "since"],
                 id="since-without-zone"),
    pytest.param("POST", "/v1/admissions", b'{"node": "\xff"}', ["body"], id="body-not-utf8"),
    pytest.param("POST", "/v1/admissions", b"[" * 100_000 + b"]" * 100_000, ["body"],
                 id="body-nested-too-deep"),
    pytest.param("PUT", "/v1/nodes/n1", b'{"capacity": {"cpu": 1, "memory": 1}, "labels": '
                 b'{"a\\ud800": "b"}}', ["body"], id="lone-surrogate-in-a-label"),
    pytest.param("POST", "/v1/extender/filter", b'{"Pod": {}, "NodeNames": ["n\\udfff"]}',
                 ["body"], id="lone-surrogate-echoed-by-the-extender"),
    pytest.param("PUT", "/v1/nodes/n1", {**NODE, "cordon_reason": "x\x00"},
                 ["body", "cordon_reason"], id="nul-in-cordon-reason"),
    pytest.param("PUT", "/v1/nodes/n1", {**NODE, "labels": {"a": "b\x00"}},
                 ["body", "labels", "a"], id="nul-in-a-label"),
    pytest.param("POST", "/v1/admissions", admission(uid="u1", namespace="a\x00"),
                 ["body", "holder", "namespace"], id="nul-in-holder-namespace"),
    pytest.param("DELETE", "/v1/admissions/a%00b", None, ["path", "holder_uid"],
                 id="nul-in-holder-uid"),
    pytest.param("PUT", "/v1/nodes/n1", {"capacity": {"cpu": "١٢", "memory": "1Gi"}},
                 ["body", "capacity", "cpu"], id="arabic-indic-digits"),
    pytest.param("POST", "/v1/extender/bind", {"PodName": "p", "PodNamespace": "../x",
                 "PodUID": "u", "Node": "n1"}, ["body", "PodNamespace"],
                 id="bind-namespace-not-a-name"),
]  # fmt: skip


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    # The extender routes answer; no case here gets as far as the Kubernetes API.
    settings = Settings(database_url=database_url, migrate_on_start=False)
    with TestClient(create_app(settings, offline_extender(build_services(settings)))) as api:
        assert api.put("/v1/nodes/n1", json=NODE).status_code == 201
        yield api


@pytest.mark.parametrize(("method", "path", "body", "loc"), INVALID)
def test_invalid_input_is_a_422_naming_it(
    client: TestClient, method: str, path: str, body: Any, loc: list[str]
) -> None:
    if isinstance(body, bytes):
        answer = client.request(method, path, content=body, headers=JSON)
    else:
        answer = client.request(method, path, json=body)
    assert answer.status_code == 422, answer.text
    assert loc in [error["loc"][: len(loc)] for error in answer.json()["detail"]], answer.text


def test_releasing_an_id_held_as_pod_and_manual_is_a_documented_409(
    client: TestClient,
) -> None:
    assert client.post("/v1/admissions", json=admission(uid="u1")).status_code == 201
    manual = {**admission(), "holder": {"kind": "manual", "id": "u1"}}
    assert client.post("/v1/admissions", json=manual).status_code == 201
    answer = client.delete("/v1/admissions/u1")
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == "holder_conflict"
    document = client.get("/openapi.json").json()
    assert "409" in document["paths"]["/v1/admissions/{holder_uid}"]["delete"]["responses"]


def test_every_guarded_route_documents_its_refusals(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            documented = set(operation["responses"])
            if path in ("/healthz", "/readyz"):
                assert not documented & {"401", "403"}, (method, path)
            else:
                assert documented >= {"401", "403", "503"}, (method, path)
