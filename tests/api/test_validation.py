"""Bad input: a 4xx naming the field, never a 500, never a change to the ledger."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.api import NODE, pod
from tests.support.strategies import json_values


def field_errors(response: Any) -> list[str]:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    if isinstance(detail, str):
        return [detail]
    return [".".join(str(p) for p in e["loc"]) + ": " + e["msg"] for e in detail]


BAD_ADMISSIONS = [
    ("negative cpu", pod("u", cpu="-1"), "requests.cpu"),
    ("unknown suffix", pod("u", memory="2Xi"), "requests.memory"),
    ("huge cpu", pod("u", cpu="1e40"), "requests.cpu"),
    ("fractional gpu", pod("u", gpu="0.5"), "requests.gpu"),
    ("boolean", pod("u", cpu=True), "requests.cpu"),
    ("list", pod("u", cpu=[1]), "requests.cpu"),
    ("nothing requested", pod("u", cpu=0, memory=0, gpu=0), "at least one"),
    ("no uid", {**pod("u"), "holder": {"kind": "pod"}}, "holder.uid"),
    ("slurm via rest", {**pod("u"), "holder": {"kind": "slurm_job", "id": "1"}}, "holder.kind"),
    ("bad node name", pod("u", node="N_1!"), "node"),
    ("extra field", {**pod("u"), "priority": 5}, "priority"),
    ("bad uid", {**pod("u"), "holder": {"kind": "pod", "uid": "a b"}}, "holder.uid"),
]


@pytest.mark.parametrize(
    ("body", "field"), [b[1:] for b in BAD_ADMISSIONS], ids=[b[0] for b in BAD_ADMISSIONS]
)
def test_bad_admissions_name_the_field(api: TestClient, body: dict[str, Any], field: str) -> None:
    api.put("/v1/nodes/n1", json=NODE)
    errors = field_errors(api.post("/v1/admissions", json=body))
    assert any(field in e for e in errors), errors
    assert api.get("/v1/holdings").json() == []


BAD_NODES = [
    ("zero cpu", {"capacity": {"cpu": 0, "memory": "1Gi"}}, "capacity.cpu"),
    ("zero memory", {"capacity": {"cpu": 1, "memory": 0}}, "capacity.memory"),
    ("missing memory", {"capacity": {"cpu": 1}}, "capacity.memory"),
    (
        "reserved above capacity",
        {"capacity": {"cpu": 1, "memory": "1Gi"}, "reserved": {"cpu": 2}},
        "reserved.cpu",
    ),
    ("unknown suffix", {"capacity": {"cpu": "1q", "memory": "1Gi"}}, "capacity.cpu"),
    ("bad alias", {"capacity": {"cpu": 1, "memory": "1Gi"}, "slurm_name": "A B"}, "slurm_name"),
]


@pytest.mark.parametrize(
    ("body", "field"), [b[1:] for b in BAD_NODES], ids=[b[0] for b in BAD_NODES]
)
def test_bad_nodes_name_the_field(api: TestClient, body: dict[str, Any], field: str) -> None:
    errors = field_errors(api.put("/v1/nodes/n1", json=body))
    assert any(field in e for e in errors), errors
    assert api.get("/v1/nodes").json() == []


def test_malformed_json_and_paths(api: TestClient) -> None:
    response = api.post(
        "/v1/admissions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert api.get("/v1/nodes/UPPER").status_code == 422
    assert api.get("/v1/events?limit=0").status_code == 422
    assert api.get("/v1/holdings?holder_kind=robot").status_code == 422


any_json = json_values(text_size=12, width=3, leaves=8)
quantities = st.one_of(any_json, st.from_regex(r"\A[+-]?[0-9.eE]{0,6}[a-zA-Z]{0,2}\Z"))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cpu=quantities, memory=quantities, gpu=quantities, extra=any_json)
def test_fuzzed_admissions_never_500(
    api: TestClient, cpu: Any, memory: Any, gpu: Any, extra: Any
) -> None:
    api.put("/v1/nodes/n1", json=NODE)
    body = pod("fuzz", cpu=cpu, memory=memory, gpu=gpu)
    if isinstance(extra, dict):
        body["holder"] = {**body["holder"], **extra}
    response = api.post("/v1/admissions", json=body)
    assert response.status_code in (200, 201, 409, 422), response.text
    if response.status_code in (200, 201):
        api.delete("/v1/admissions/fuzz")
    node = api.get("/v1/nodes/n1").json()
    assert node["free"]["cpu_millis"] >= 0
