"""The REST API in-process, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.ledger_errors import InvalidRequest
from app.core.records import HolderKind
from app.core.resources import Resources
from app.ledger.service import SnapshotEntry
from tests.support.api import NODE, pod
from tests.support.headroom import set_headroom

GIB = 2**30


@pytest.fixture
def n1(api: TestClient) -> str:
    assert api.put("/v1/nodes/n1", json=NODE).status_code == 201
    return "n1"


def test_health(api: TestClient) -> None:
    assert api.get("/healthz").json() == {"status": "ok", "checks": {}}
    assert api.get("/readyz").json() == {"status": "ok", "checks": {"database": "ok"}}
    assert api.get("/docs").status_code == 200
    assert "/v1/admissions" in api.get("/openapi.json").json()["paths"]


def test_node_lifecycle(api: TestClient) -> None:
    created = api.put("/v1/nodes/n1", json={**NODE, "slurm_name": "sn1", "labels": {"a": "b"}})
    assert created.status_code == 201
    body = created.json()
    assert body["capacity"] == {
        "cpu": "8",
        "memory": "16Gi",
        "gpu": 2,
        "cpu_millis": 8000,
        "memory_bytes": 16 * 2**30,
    }
    assert body["free"]["cpu"] == "7500m"
    assert body["slurm_name"] == "sn1"
    assert body["admissible"] is True
    assert api.put("/v1/nodes/n1", json=NODE).status_code == 200
    assert [n["name"] for n in api.get("/v1/nodes").json()] == ["n1"]
    assert api.delete("/v1/nodes/n1").status_code == 204
    assert api.get("/v1/nodes/n1").status_code == 404


def test_a_node_read_can_be_put_back(api: TestClient) -> None:
    """GET then PUT of the same body: the base-unit twins agree with their quantities, and
    what the ledger computes (free, holdings, headroom...) is ignored."""
    spec = {**NODE, "slurm_name": "sn1", "labels": {"a": "b"}}
    assert api.put("/v1/nodes/n1", json=spec).status_code == 201
    assert api.post("/v1/admissions", json=pod("u1")).status_code == 201
    assert api.put("/v1/nodes/n1", json={**spec, "cordon_reason": "disk"}).status_code == 200
    read = api.get("/v1/nodes/n1").json()
    put = api.put("/v1/nodes/n1", json=read)
    assert put.status_code == 200, put.json()
    again = api.get("/v1/nodes/n1").json()
    assert {**again, "updated_at": None} == {**read, "updated_at": None}
    # A twin alone, where the quantity defaults (reserved.gpu and .cpu do), still has to agree.
    assert api.put("/v1/nodes/n1", json={**NODE, "reserved": {"cpu_millis": 0}}).status_code == 200


TWINS = {
    "capacity.cpu_millis": ({"capacity": {"cpu": "8", "memory": "1Gi", "cpu_millis": 7999}}),
    "capacity.memory_bytes": ({"capacity": {"cpu": "8", "memory": "1Gi", "memory_bytes": 1}}),
    "reserved.cpu_millis": ({**NODE, "reserved": {"cpu": "500m", "cpu_millis": 5000}}),
    "reserved.memory_bytes": ({**NODE, "reserved": {"memory_bytes": 1024}}),
}


@pytest.mark.parametrize(("field", "body"), TWINS.items(), ids=TWINS.keys())
def test_a_twin_that_disagrees_is_a_422_naming_it(
    api: TestClient, field: str, body: dict[str, Any]
) -> None:
    answer = api.put("/v1/nodes/n1", json=body)
    assert answer.status_code == 422, answer.json()
    [error] = answer.json()["detail"]
    assert error["loc"] == ["body", *field.split(".")]
    assert "disagrees with" in error["msg"]
    assert api.get("/v1/nodes").json() == []


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({**NODE, "capacity": {**NODE["capacity"], "cpu_millis": "8000"}}, "cpu_millis"),
        ({**NODE, "capacity": {**NODE["capacity"], "cpu_milis": 8000}}, "cpu_milis"),
        ({**NODE, "fre": {}}, "fre"),
    ],
    ids=["a twin not an integer", "a misspelt twin", "a misspelt field"],
)
def test_what_is_neither_spec_nor_read_only_is_still_refused(
    api: TestClient, body: dict[str, Any], loc: str
) -> None:
    answer = api.put("/v1/nodes/n1", json=body)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][-1] == loc


def test_admission_flow(api: TestClient, n1: str) -> None:
    first = api.post("/v1/admissions", json=pod("u1", gpu=1))
    assert first.status_code == 201, first.text
    holding = first.json()
    assert holding["holder"] == {"kind": "pod", "id": "u1", "name": "ns/p-u1"}
    assert holding["requests"]["cpu"] == "1500m"
    assert holding["requests"]["memory_bytes"] == 2 * 2**30
    again = api.post("/v1/admissions", json=pod("u1", gpu=1))
    assert again.status_code == 200
    assert again.json() == holding

    node = api.get("/v1/nodes/n1").json()
    assert node["held_by_kubernetes"]["cpu"] == "1500m"
    assert node["free"]["cpu"] == "6"
    assert [h["holder"]["id"] for h in node["holdings"]] == ["u1"]
    assert api.delete("/v1/nodes/n1").status_code == 409

    assert [h["holder"]["id"] for h in api.get("/v1/holdings?node=n1&holder_kind=pod").json()] == [
        "u1"
    ]
    assert api.get("/v1/holdings?holder_kind=slurm_job").json() == []

    released = api.delete("/v1/admissions/u1")
    assert released.status_code == 200
    assert released.json()["holder"]["id"] == "u1"
    assert api.delete("/v1/admissions/u1").status_code == 404
    assert api.get("/v1/nodes/n1").json()["free"]["cpu"] == "7500m"


def test_rejection_names_resources_and_amounts(api: TestClient, n1: str) -> None:
    response = api.post("/v1/admissions", json=pod("big", cpu=8, memory="1Gi", gpu=3))
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "admission_rejected"
    assert body["retryable"] is True
    assert "cpu: requested 8, free 7500m" in body["detail"]
    assert "gpu: requested 3, free 2" in body["detail"]
    assert [(s["resource"], s["requested"], s["free"]) for s in body["shortfalls"]] == [
        ("cpu", "8", "7500m"),
        ("gpu", "3", "2"),
    ]
    events = api.get("/v1/events?node=n1&kind=rejected").json()
    assert events[-1]["holder_id"] == "big"


def test_unknown_node_and_holder(api: TestClient) -> None:
    assert api.post("/v1/admissions", json=pod("u1", node="nope")).status_code == 404
    assert api.get("/v1/holdings?node=nope").status_code == 404
    assert api.delete("/v1/admissions/nobody").status_code == 404


def test_manual_reservation(api: TestClient, n1: str) -> None:
    body = {
        "node": "n1",
        "holder": {"kind": "manual", "id": "maint-1", "name": "rack work"},
        "requests": {"cpu": 2},
    }
    assert api.post("/v1/admissions", json=body).status_code == 201
    assert api.get("/v1/nodes/n1").json()["held_manually"]["cpu"] == "2"
    assert api.delete("/v1/admissions/maint-1?kind=manual").status_code == 200


def test_cordon(api: TestClient, n1: str) -> None:
    api.put("/v1/nodes/n1", json={**NODE, "cordon_reason": "firmware update"})
    node = api.get("/v1/nodes/n1").json()
    assert node["admissible"] is False
    assert node["reason"] == "firmware update"
    response = api.post("/v1/admissions", json=pod("u1"))
    assert response.status_code == 409
    assert "firmware update" in response.json()["detail"]


def test_capacity_below_holdings_needs_force(api: TestClient, n1: str) -> None:
    api.post("/v1/admissions", json=pod("u1", cpu=4))
    small = {"capacity": {"cpu": "2", "memory": "16Gi"}}
    response = api.put("/v1/nodes/n1", json=small)
    assert response.status_code == 409
    assert response.json()["code"] == "capacity_below_holdings"
    forced = api.put("/v1/nodes/n1?force=true", json=small)
    assert forced.status_code == 200
    assert forced.json()["admissible"] is False


def test_events_query(api: TestClient, n1: str) -> None:
    api.post("/v1/admissions", json=pod("u1"))
    api.delete("/v1/admissions/u1")
    events = api.get("/v1/events?node=n1").json()
    assert [e["kind"] for e in events] == ["node_created", "admitted", "released"]
    assert api.get(f"/v1/events?after={events[0]['id']}&limit=1").json()[0]["kind"] == "admitted"
    since = events[-1]["at"]
    assert [e["kind"] for e in api.get("/v1/events", params={"since": since}).json()] == [
        "released"
    ]
    assert api.get("/v1/events?since=2026-01-01T00:00:00").status_code == 422


def test_a_slurm_jobs_holding_is_not_released_through_the_api(api: TestClient, n1: str) -> None:
    # Only the Slurm sync writes slurm_job holdings (README); the API documents pod or manual.
    ledger = api.app.state.services.ledger  # type: ignore[attr-defined]
    job = SnapshotEntry("job 1234", Resources(cpu_millis=2000, memory_bytes=2**30, gpus=0))
    ledger.replace_holdings(n1, HolderKind.SLURM_JOB, {"1234": job})
    refused = api.delete("/v1/admissions/1234?kind=slurm_job")
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["query", "kind"]
    assert api.delete("/v1/admissions/1234").status_code == 404  # pod or manual: none
    held = api.get(f"/v1/holdings?node={n1}&holder_kind=slurm_job").json()
    assert [h["holder"]["id"] for h in held] == ["1234"]
    with pytest.raises(InvalidRequest):
        ledger.release("1234", HolderKind.SLURM_JOB)


def test_a_node_shows_its_headroom(api: TestClient, n1: str) -> None:
    zero = {"cpu": "0", "memory": "0", "gpu": 0, "cpu_millis": 0, "memory_bytes": 0}
    off = {"target": zero, "granted": zero, "free": zero, "used_at": None}
    assert api.get("/v1/nodes/n1").json()["headroom"] == off  # the headroom off

    assert api.post("/v1/admissions", json=pod("u1")).status_code == 201  # 1500m, 2Gi
    manual = {"node": "n1", "holder": {"kind": "manual", "id": "ops"}, "requests": {"cpu": "1"}}
    assert api.post("/v1/admissions", json=manual).status_code == 201
    ledger = api.app.state.services.ledger  # type: ignore[attr-defined]
    used = datetime(2026, 11, 25, 14, 3, 11, tzinfo=UTC)
    set_headroom(
        ledger, n1, target=Resources(2000, 4 * GIB), granted=Resources(4000, 6 * GIB), used_at=used
    )
    node = api.get("/v1/nodes/n1").json()
    headroom = node["headroom"]
    assert headroom["target"] == {
        "cpu": "2", "memory": "4Gi", "gpu": 0, "cpu_millis": 2000, "memory_bytes": 4 * GIB
    }  # fmt: skip
    assert headroom["granted"]["cpu"] == "4"
    # granted - the pod - the reservation: 4 - 1500m - 1 CPUs, 6Gi - 2Gi.
    assert headroom["free"] == {
        "cpu": "1500m", "memory": "4Gi", "gpu": 0, "cpu_millis": 1500, "memory_bytes": 4 * GIB
    }  # fmt: skip
    assert headroom["used_at"] == "2026-11-25T14:03:11Z"
    assert node["free"]["cpu"] == "5"  # the node's own free is not the headroom's
    # Listings carry it too, whichever the sort.
    for sort in ("name", "free_cpu"):
        (listed,) = api.get("/v1/nodes", params={"sort": sort}).json()
        assert listed["headroom"] == headroom

    # Held beyond the grant (a grant lowered before a push): free is 0, never negative.
    set_headroom(ledger, n1, target=Resources(2000), granted=Resources(2000, GIB))
    assert api.get("/v1/nodes/n1").json()["headroom"]["free"] == zero


def test_the_openapi_document_describes_the_headroom(api: TestClient) -> None:
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["NodeOut"]["properties"]["headroom"] == {
        "$ref": "#/components/schemas/HeadroomOut"
    }
    fields = schemas["HeadroomOut"]["properties"]
    assert set(fields) == {"target", "granted", "free", "used_at"}
    assert "holdings included" in fields["granted"]["description"]
