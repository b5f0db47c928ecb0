"""The extender endpoints over HTTP with the scheduler's own wire shapes: typed, so a
malformed body answers 422 naming the field and nothing a caller sends ever answers 5xx.
The Kubernetes API behind bind is a fake here; tests/kube/test_e2e.py drives the same
endpoints from a real kube-scheduler."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from app.bootstrap import build_services
from app.kube.client import KubeError
from app.main import create_app
from app.settings import Settings
from tests.support.extender import offline_extender
from tests.support.strategies import json_values

POD_UID = "0f4c-uid"


def pod(cpu: str = "2", memory: str = "1Gi", uid: str = POD_UID) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "default", "uid": uid, "labels": {"a": "b"}},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
            ],
            "schedulerName": "nodeledger",
        },
        "status": {"phase": "Pending"},
    }


class FakeKube:
    """The two calls bind makes: read the pod, create the Binding."""

    def __init__(self) -> None:
        self.pods = {("default", "web"): pod()}
        self.bound: list[tuple[str, str, str, str]] = []
        self.fail_bind = False

    def request(self, method: str, path: str) -> dict[str, Any]:
        namespace, name = path.split("/")[4], path.split("/")[6]
        if (namespace, name) not in self.pods:
            raise KubeError(f"pods {name!r} not found", status=404)
        return self.pods[(namespace, name)]

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        if self.fail_bind:
            raise KubeError("the API server said no", status=409)
        self.bound.append((namespace, name, uid, node))


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def client(sqlite_url: str, kube: FakeKube) -> Iterator[TestClient]:
    settings = Settings(database_url=sqlite_url, migrate_on_start=False)
    services = offline_extender(build_services(settings), kube=kube)
    with TestClient(create_app(settings, services)) as api:
        for name, cpu in (("kn1", "4"), ("kn2", "1")):
            api.put(f"/v1/nodes/{name}", json={"capacity": {"cpu": cpu, "memory": "8Gi"}})
        yield api


def test_filter_with_node_names_answers_in_the_schedulers_shape(client: TestClient) -> None:
    body = {"Pod": pod(), "Nodes": None, "NodeNames": ["kn1", "kn2", "elsewhere"]}
    answer = client.post("/v1/extender/filter", json=body)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["NodeNames"] == ["kn1"]
    assert set(result["FailedNodes"]) == {"kn2", "elsewhere"}
    assert result["Error"] == ""


def test_filter_with_node_objects_sends_the_fitting_objects_back(client: TestClient) -> None:
    nodes = [{"metadata": {"name": n, "labels": {"x": n}}, "status": {}} for n in ("kn1", "kn2")]
    answer = client.post("/v1/extender/filter", json={"Pod": pod(), "Nodes": {"items": nodes}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["Nodes"]["items"] == [nodes[0]]  # whole, as sent


def test_prioritize_scores_every_candidate(client: TestClient) -> None:
    answer = client.post("/v1/extender/prioritize", json={"Pod": pod(), "NodeNames": ["kn1"]})
    assert answer.status_code == 200, answer.text
    assert [h["Host"] for h in answer.json()] == ["kn1"]
    assert 0 <= answer.json()[0]["Score"] <= 10


def test_every_extender_call_is_timed_and_weighed_by_verb(client: TestClient) -> None:
    body = {"Pod": pod(), "NodeNames": ["kn1", "kn2"]}
    sizes = [
        (len(answer.request.content), len(answer.content))
        for answer in (
            client.post("/v1/extender/filter", json=body),
            client.post("/v1/extender/filter", json=body),
            client.post("/v1/extender/prioritize", json=body),
        )
    ]
    client.get("/v1/nodes")  # another route: not counted
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}

    def value(family: str, sample: str, **labels: str) -> float:
        found = families[family].samples
        return next(s.value for s in found if s.name == sample and s.labels == labels)

    duration = "nodeledger_extender_request_duration_seconds"
    assert value(duration, f"{duration}_count", verb="filter") == 2
    assert value(duration, f"{duration}_count", verb="prioritize") == 1
    assert value(duration, f"{duration}_count", verb="bind") == 0
    assert value(duration, f"{duration}_sum", verb="filter") > 0
    counted = "nodeledger_extender_bytes"
    assert value(counted, f"{counted}_total", verb="filter", direction="received") == (
        sizes[0][0] + sizes[1][0]
    )
    assert value(counted, f"{counted}_total", verb="prioritize", direction="sent") == sizes[2][1]


def test_bind_admits_then_binds(client: TestClient, kube: FakeKube) -> None:
    args = {"PodName": "web", "PodNamespace": "default", "PodUID": POD_UID, "Node": "kn1"}
    answer = client.post("/v1/extender/bind", json=args)
    assert answer.json() == {"Error": ""}
    assert kube.bound == [("default", "web", POD_UID, "kn1")]
    holdings = client.get("/v1/holdings", params={"node": "kn1"}).json()
    assert [h["holder"]["id"] for h in holdings] == [POD_UID]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"PodUID": "another-uid"}, "was replaced"),
        ({"Node": "kn2"}, "cpu: requested 2, free 1"),
        ({"Node": "nowhere"}, "nowhere"),
        ({"PodName": "gone"}, "not found"),
    ],
    ids=["uid changed", "does not fit", "unknown node", "pod gone"],
)
def test_bind_refusals_are_errors_for_the_scheduler(
    client: TestClient, kube: FakeKube, change: dict[str, str], error: str
) -> None:
    args = {"PodName": "web", "PodNamespace": "default", "PodUID": POD_UID, "Node": "kn1"}
    answer = client.post("/v1/extender/bind", json={**args, **change})
    assert answer.status_code == 200
    assert error in answer.json()["Error"]
    assert kube.bound == []


def test_a_failed_binding_gives_the_hold_back(client: TestClient, kube: FakeKube) -> None:
    kube.fail_bind = True
    args = {"PodName": "web", "PodNamespace": "default", "PodUID": POD_UID, "Node": "kn1"}
    assert "binding failed" in client.post("/v1/extender/bind", json=args).json()["Error"]
    assert client.get("/v1/holdings", params={"node": "kn1"}).json() == []


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("filter", {"NodeNames": ["kn1"]}, "Pod"),
        ("filter", {"Pod": pod(), "NodeNames": "kn1"}, "NodeNames"),
        ("filter", {"Pod": {"spec": {"containers": {"c": 1}}}}, "containers"),
        ("filter", {"Pod": pod(), "Nodes": {"items": [{"metadata": 7}]}}, "metadata"),
        ("filter", ["not", "an", "object"], "body"),
        ("prioritize", {"Pod": "web"}, "Pod"),
        ("bind", {"PodName": "web", "PodNamespace": "default", "Node": "kn1"}, "PodUID"),
        ("bind", {"PodName": "web", "PodNamespace": "default", "PodUID": "u", "Node": ""}, "Node"),
    ],
)
def test_malformed_bodies_answer_422_naming_the_field(
    client: TestClient, path: str, body: Any, field: str
) -> None:
    answer = client.post(f"/v1/extender/{path}", json=body)
    assert answer.status_code == 422, answer.text
    assert field in answer.text


def test_bad_quantities_are_the_schedulers_error_not_a_crash(client: TestClient) -> None:
    answer = client.post("/v1/extender/filter", json={"Pod": pod(cpu="lots"), "NodeNames": ["kn1"]})
    assert answer.status_code == 200
    assert "invalid pod requests" in answer.json()["Error"]


JSON = json_values(text_size=8, width=4, leaves=20)
# Bodies shaped like the scheduler's with any values inside, and bodies of any shape.
SHAPED = st.fixed_dictionaries(
    {},
    optional={
        "Pod": st.fixed_dictionaries(
            {},
            optional={
                "metadata": JSON | st.fixed_dictionaries({}, optional={"uid": JSON, "name": JSON}),
                "spec": JSON
                | st.fixed_dictionaries(
                    {},
                    optional={
                        "containers": st.lists(
                            st.fixed_dictionaries({}, optional={"resources": JSON}), max_size=3
                        )
                        | JSON,
                        "initContainers": JSON,
                        "overhead": JSON,
                    },
                ),
            },
        )
        | JSON,
        "NodeNames": st.lists(st.text(max_size=6), max_size=3) | JSON,
        "Nodes": JSON,
        "PodName": JSON,
        "PodNamespace": JSON,
        "PodUID": JSON,
        "Node": JSON,
    },
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(path=st.sampled_from(["filter", "prioritize", "bind"]), body=SHAPED | JSON)
def test_no_body_ever_answers_5xx(client: TestClient, path: str, body: Any) -> None:
    answer = client.post(f"/v1/extender/{path}", json=body)
    assert answer.status_code < 500, answer.text
