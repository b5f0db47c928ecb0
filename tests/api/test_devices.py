"""GPU devices in the REST API (issues 23, 32), in-process on SQLite and PostgreSQL: an
admission may name its devices, one object each (index and UUID), every holding shows them
that way with its hold job, and what is wrong with them is a 422 naming `devices` or a 409
naming the device and its holder. The earlier shape, indices beside `device_uuids`, is
still accepted (deprecated)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

NODE = {"capacity": {"cpu": "8", "memory": "16Gi", "gpu": 2}}
UUID = "GPU-5ad9f3ab-1c4f-4e52-9b1e-0f3c1b2d4e6a"


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


def device(index: int, uuid: str = "") -> dict[str, Any]:
    return {"index": index, "uuid": uuid}


@pytest.fixture
def n1(api: TestClient) -> str:
    assert api.put("/v1/nodes/n1", json=NODE).status_code == 201
    return "n1"


def test_a_holding_shows_its_devices_everywhere(api: TestClient, n1: str) -> None:
    admitted = api.post("/v1/admissions", json=pod("u1", [{"index": 1, "uuid": UUID}]))
    assert admitted.status_code == 201
    assert (admitted.json()["devices"], admitted.json()["slurm_hold"]) == ([device(1, UUID)], None)
    assert "device_uuids" not in admitted.json()
    again = api.post("/v1/admissions", json=pod("u1", [{"index": 1}]))  # UUIDs: informational
    assert (again.status_code, again.json()["devices"]) == (200, [device(1, UUID)])
    counted = api.post("/v1/admissions", json=pod("u2"))
    assert counted.json()["devices"] == []
    for holdings in (
        api.get("/v1/holdings").json(),
        api.get(f"/v1/nodes/{n1}").json()["holdings"],
        api.get("/v1/nodes").json()[0]["holdings"],
    ):
        devices = {h["holder"]["id"]: h["devices"] for h in holdings}
        assert devices == {"u1": [device(1, UUID)], "u2": []}
        assert {h["slurm_hold"] for h in holdings} == {None}
    released = api.delete("/v1/admissions/u1")
    assert released.json()["devices"] == [device(1, UUID)]
    events = api.get("/v1/events", params={"node": n1}).json()
    admitted_event = next(e for e in events if e["kind"] == "admitted")
    assert admitted_event["message"] == "admitted ns/p-u1 on GPU device 1"
    assert admitted_event["details"]["devices"] == [device(1, UUID)]


def test_the_deprecated_two_arrays_are_still_accepted(api: TestClient, n1: str) -> None:
    admitted = api.post("/v1/admissions", json=pod("u1", [1, 0], 2, [UUID, ""]))
    assert admitted.status_code == 201
    # Sorted by index, each with its UUID; answered in the one shape.
    assert admitted.json()["devices"] == [device(0), device(1, UUID)]
    assert api.post("/v1/admissions", json=pod("u1", [0, 1], 2)).status_code == 200


def test_a_held_device_is_a_409_naming_it_and_its_holder(api: TestClient, n1: str) -> None:
    assert api.post("/v1/admissions", json=pod("u1", [device(0)])).status_code == 201
    refused = api.post("/v1/admissions", json=pod("u2", [device(0)]))
    assert refused.status_code == 409
    body = refused.json()
    assert (body["code"], body["retryable"]) == ("device_taken", True)
    assert body["detail"] == "node 'n1': GPU device 0 is held by pod ns/p-u1 (u1)"
    other = api.post("/v1/admissions", json=pod("u1", [device(1)]))  # same holder, other device
    assert (other.status_code, other.json()["code"]) == (409, "holder_conflict")


BAD = {
    "negative": ([device(-1)], ["body", "devices", 0, "index"]),
    "a string": ([{"index": "0"}], ["body", "devices", 0, "index"]),
    "a float": ([{"index": 0.5}], ["body", "devices", 0, "index"]),
    "a boolean": ([{"index": True}], ["body", "devices", 0, "index"]),
    "no index": ([{"uuid": UUID}], ["body", "devices", 0, "index"]),
    "an unknown key": ([{"index": 0, "serial": "1"}], ["body", "devices", 0, "serial"]),
    "a UUID not a string": ([{"index": 0, "uuid": 7}], ["body", "devices", 0, "uuid"]),
    "not a list": (device(0), ["body", "devices"]),
    "too many": ([device(i) for i in range(65)], ["body", "devices"]),
    # The rules of app.core.devices, answered naming the field.
    "twice": ([device(1), device(1, UUID)], ["body", "devices"]),
    "a UUID too long": ([device(0, "G" * 129)], ["body", "devices"]),
    "a UUID not printable": ([device(0, "GPU-\u00e9")], ["body", "devices"]),
    "a UUID with a control character": ([device(0, "GPU-\n")], ["body", "devices"]),
    # What only the ledger can judge: the node's GPUs and the request's count.
    "not on the node": ([device(2)], ["body", "devices"]),
    "fewer than the GPUs asked": ([], None),
    "more than the GPUs asked": ([device(0), device(1)], ["body", "devices"]),
    # The deprecated shape: its indices are judged as the objects' are.
    "an index negative": ([-1], ["body", "devices", 0, "index"]),
    "an index a string": (["0"], ["body", "devices", 0, "index"]),
    "an index a boolean": ([True], ["body", "devices", 0, "index"]),
    "an index twice": ([1, 1], ["body", "devices"]),
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
    assert devices["items"] == {"$ref": "#/components/schemas/DeviceIn"}
    index = schemas["DeviceIn"]["properties"]["index"]
    assert (index["type"], index["minimum"], index["exclusiveMaximum"]) == ("integer", 0, 10**6)
    assert schemas["DeviceIn"]["required"] == ["index"]
    assert {"devices", "slurm_hold"} <= set(schemas["HoldingOut"]["required"])
    assert "device_uuids" not in schemas["HoldingOut"]["properties"]
    assert schemas["HoldingOut"]["properties"]["devices"]["items"]["$ref"].endswith("DeviceOut")
    assert schemas["AdmissionIn"]["properties"]["device_uuids"]["deprecated"] is True


BAD_UUIDS = {
    "fewer than the devices": ([0, 1], [UUID]),
    "more than the devices": ([0], [UUID, UUID]),
    "without devices": (None, [UUID]),
    "too long": ([0], ["G" * 129]),
    "not printable": ([0], ["GPU-\u00e9"]),
    "a control character": ([0], ["GPU-\n"]),
    "and in the objects": ([device(0, UUID)], [UUID]),
}


@pytest.mark.parametrize(("devices", "uuids"), BAD_UUIDS.values(), ids=BAD_UUIDS.keys())
def test_bad_device_uuids_are_a_422_naming_the_field(
    api: TestClient, n1: str, devices: Any, uuids: Any
) -> None:
    gpu = len(devices) if devices is not None else 1
    answer = api.post("/v1/admissions", json=pod("u1", devices, gpu, uuids))
    assert answer.status_code == 422, answer.json()
    body = answer.json()
    assert (body["code"], body["retryable"]) == ("invalid_request", False)
    assert body["detail"][0]["loc"] == ["body", "device_uuids"]
    assert api.get("/v1/holdings").json() == []


@pytest.mark.parametrize("uuids", [[7], "GPU-0"], ids=["not a string", "not a list"])
def test_device_uuids_of_another_type_are_a_422_naming_them(
    api: TestClient, n1: str, uuids: Any
) -> None:
    answer = api.post("/v1/admissions", json=pod("u1", [0], 1, uuids))
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][:2] == ["body", "device_uuids"]
