"""GPU devices in the REST API (issue 23), in-process on SQLite and PostgreSQL: an
admission may name its devices (and their UUIDs), every holding shows them and its hold
job, and what is wrong with them is a 422 naming `devices` (`device_uuids`) or a 409 naming
the device and its holder."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

NODE = {"capacity": {"cpu": "8", "memory": "16Gi", "gpu": 2}}


def pod(uid: str, devices: Any = None, gpu: int = 1, uuids: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "node": "n1",
        "holder": {"kind": "pod", "namespace": "ns", "name": f"p-{uid}", "uid": uid},
        "requests": {"cpu": "1", "memory": "1Gi", "gpu": gpu},
    }
    if devices is not None:
        body["devices"] = devices
    if uuids is not None:
        body["device_uuids"] = uuids
    return body


@pytest.fixture
def n1(api: TestClient) -> str:
    assert api.put("/v1/nodes/n1", json=NODE).status_code == 201
    return "n1"


def test_a_holding_shows_its_devices_everywhere(api: TestClient, n1: str) -> None:
    admitted = api.post("/v1/admissions", json=pod("u1", [1]))
    assert admitted.status_code == 201
    assert (admitted.json()["devices"], admitted.json()["slurm_hold"]) == ([1], None)
    again = api.post("/v1/admissions", json=pod("u1", [1]))
    assert again.status_code == 200
    counted = api.post("/v1/admissions", json=pod("u2"))
    assert counted.json()["devices"] == []
    for holdings in (
        api.get("/v1/holdings").json(),
        api.get(f"/v1/nodes/{n1}").json()["holdings"],
        api.get("/v1/nodes").json()[0]["holdings"],
    ):
        assert {h["holder"]["id"]: h["devices"] for h in holdings} == {"u1": [1], "u2": []}
        assert {h["slurm_hold"] for h in holdings} == {None}
    released = api.delete("/v1/admissions/u1")
    assert released.json()["devices"] == [1]
    events = api.get("/v1/events", params={"node": n1}).json()
    assert any(e["message"] == "admitted ns/p-u1 on GPU device 1" for e in events)


def test_a_held_device_is_a_409_naming_it_and_its_holder(api: TestClient, n1: str) -> None:
    assert api.post("/v1/admissions", json=pod("u1", [0])).status_code == 201
    refused = api.post("/v1/admissions", json=pod("u2", [0]))
    assert refused.status_code == 409
    body = refused.json()
    assert (body["code"], body["retryable"]) == ("device_taken", True)
    assert body["detail"] == "node 'n1': GPU device 0 is held by pod ns/p-u1 (u1)"
    other = api.post("/v1/admissions", json=pod("u1", [1]))  # the same holder, other device
    assert (other.status_code, other.json()["code"]) == (409, "holder_conflict")


BAD = {
    "negative": ([-1], ["body", "devices", 0]),
    "a string": (["0"], ["body", "devices", 0]),
    "a float": ([0.5], ["body", "devices", 0]),
    "a boolean": ([True], ["body", "devices", 0]),
    "twice": ([1, 1], ["body", "devices"]),
    "too many": (list(range(65)), ["body", "devices"]),
    "not a list": (1, ["body", "devices"]),
    # What only the ledger can judge: the node's GPUs and the request's count.
    "not on the node": ([2], ["body", "devices"]),
    "fewer than the GPUs asked": ([], None),
    "more than the GPUs asked": ([0, 1], ["body", "devices"]),
}


@pytest.mark.parametrize(("devices", "loc"), BAD.values(), ids=BAD.keys())
def test_bad_devices_are_a_422_naming_the_field(
    api: TestClient, n1: str, devices: Any, loc: list[Any] | None
) -> None:
    answer = api.post("/v1/admissions", json=pod("u1", devices))
    if loc is None:  # no devices named: GPUs counted, as ever
        assert answer.status_code == 201
        return
    assert answer.status_code == 422, answer.json()
    body = answer.json()
    assert (body["code"], body["retryable"]) == ("invalid_request", False)
    assert body["detail"][0]["loc"] == loc
    assert api.get("/v1/holdings").json() == []


def test_the_document_describes_the_field(api: TestClient) -> None:
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    devices = schemas["AdmissionIn"]["properties"]["devices"]
    assert devices["maxItems"] == 64
    assert devices["items"] == {"type": "integer", "minimum": 0, "exclusiveMaximum": 10**6}
    assert {"devices", "slurm_hold", "device_uuids"} <= set(schemas["HoldingOut"]["required"])
    uuids = schemas["AdmissionIn"]["properties"]["device_uuids"]
    assert uuids["items"] == {"type": "string", "maxLength": 128, "pattern": "^[ -~]*$"}


UUID = "GPU-5ad9f3ab-1c4f-4e52-9b1e-0f3c1b2d4e6a"


def test_a_holding_shows_its_device_uuids(api: TestClient, n1: str) -> None:
    admitted = api.post("/v1/admissions", json=pod("u1", [1, 0], 2, [UUID, ""]))
    assert admitted.status_code == 201
    # Sorted with their devices; "" for one not known.
    assert (admitted.json()["devices"], admitted.json()["device_uuids"]) == ([0, 1], ["", UUID])
    for holdings in (
        api.get("/v1/holdings").json(),
        api.get(f"/v1/nodes/{n1}").json()["holdings"],
        api.get("/v1/nodes").json()[0]["holdings"],
    ):
        assert [h["device_uuids"] for h in holdings] == [["", UUID]]
    assert api.delete("/v1/admissions/u1").json()["device_uuids"] == ["", UUID]
    counted = api.post("/v1/admissions", json=pod("u2"))
    assert counted.json()["device_uuids"] == []


BAD_UUIDS = {
    "fewer than the devices": ([0, 1], [UUID], ["body", "device_uuids"]),
    "more than the devices": ([0], [UUID, UUID], ["body", "device_uuids"]),
    "without devices": (None, [UUID], ["body", "device_uuids"]),
    "too long": ([0], ["G" * 129], ["body", "device_uuids", 0]),
    "not printable": ([0], ["GPU-\u00e9"], ["body", "device_uuids", 0]),
    "a control character": ([0], ["GPU-\n"], ["body", "device_uuids", 0]),
    "not a string": ([0], [7], ["body", "device_uuids", 0]),
    "not a list": ([0], UUID, ["body", "device_uuids"]),
}


@pytest.mark.parametrize(("devices", "uuids", "loc"), BAD_UUIDS.values(), ids=BAD_UUIDS.keys())
def test_bad_device_uuids_are_a_422_naming_the_field(
    api: TestClient, n1: str, devices: Any, uuids: Any, loc: list[Any]
) -> None:
    gpu = len(devices) if devices is not None else 1
    answer = api.post("/v1/admissions", json=pod("u1", devices, gpu, uuids))
    assert answer.status_code == 422, answer.json()
    body = answer.json()
    assert (body["code"], body["retryable"]) == ("invalid_request", False)
    assert body["detail"][0]["loc"] == loc
    assert api.get("/v1/holdings").json() == []
