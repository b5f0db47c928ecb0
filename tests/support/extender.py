"""An application's services with a scheduler extender but no Kubernetes API: for tests
whose calls never get as far as one (filter, prioritize, refused bodies), or that bring a
fake of their own."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

from fastapi.testclient import TestClient

from app.bootstrap import Services, build_services
from app.core.caps import KubeCaps
from app.kube.claims import PodDevices
from app.kube.client import KubeClient, KubeError
from app.kube.extender.service import Extender
from app.main import create_app
from app.settings import Settings


def offline_extender(
    services: Services, caps: KubeCaps | None = None, *, kube: Any = None, **options: Any
) -> Services:
    """``services`` with an Extender whose Kubernetes client is ``kube`` (absent unless
    given)."""
    extender = Extender(
        services.admissions,
        cast(KubeClient, kube),
        caps,
        gpu_resource="nvidia.com/gpu",
        snapshot=services.snapshot,
        **options,
    )
    return replace(services, extender=extender)


DRIVER = "gpu.example.com"


NODE = "kn3"


UID = "uid-train"


def gpu_pod(*claims: str, gpu: int = 0, template: bool = False) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": "1", "memory": "1Gi"}
    if gpu:
        requests["nvidia.com/gpu"] = str(gpu)
    entries: list[dict[str, Any]] = [
        {"name": f"e{i}", "resourceClaimTemplateName": c}
        if template
        else {"name": f"e{i}", "resourceClaimName": c}
        for i, c in enumerate(claims)
    ]
    spec: dict[str, Any] = {
        "schedulerName": "nodeledger",
        "containers": [{"name": "c", "resources": {"requests": requests}}],
    }
    if entries:
        spec["resourceClaims"] = entries
    return {
        "metadata": {"name": "train", "namespace": "ml", "uid": UID},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def allocated(name: str, *devices: str, driver: str = DRIVER) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": driver, "pool": NODE, "device": d} for d in devices]
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def gpu_attributes(i: int) -> dict[str, Any]:
    """Index and UUID: gpu1's UUID qualified by the driver's domain, gpu3 without one."""
    attributes: dict[str, Any] = {"index": {"int": i}}
    if i == 1:
        attributes[f"{DRIVER}/uuid"] = {"string": "GPU-1"}
    elif i != 3:
        attributes["uuid"] = {"string": f"GPU-{i}"}
    return attributes


SLICE = {
    "spec": {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu{i}", "attributes": gpu_attributes(i)} for i in range(4)],
    }
}


class FakeKube:
    """What bind reads (the pod, its claims, the node's slices) and the Binding."""

    def __init__(self) -> None:
        self.pod = gpu_pod("train-gpu")
        self.claims = {"train-gpu": allocated("train-gpu", "gpu1")}
        self.slices = [SLICE]
        self.calls: list[str] = []
        self.bound: list[str] = []
        self.claim_error: KubeError | None = None
        self.slices_error: KubeError | None = None

    def request(self, method: str, path: str) -> dict[str, Any]:
        self.calls.append(f"{method} {path}")
        return copy.deepcopy(self.pod)

    def resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(f"claim {namespace}/{name}")
        if self.claim_error is not None:
            raise self.claim_error
        if name not in self.claims:
            raise KubeError(f"resourceclaims {name!r} not found", status=404)
        return copy.deepcopy(self.claims[name])

    def resource_slices(self, node: str, drivers: Any) -> list[dict[str, Any]]:
        self.calls.append(f"slices {node} {sorted(drivers)}")
        if self.slices_error is not None:
            raise self.slices_error
        return copy.deepcopy(self.slices)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.bound.append(f"{namespace}/{name} {node}")


def serve(sqlite_url: str, kube: FakeKube, drivers: set[str]) -> Iterator[TestClient]:
    settings = Settings(database_url=sqlite_url, migrate_on_start=False)
    devices = PodDevices(kube, drivers, "index") if drivers else None  # type: ignore[arg-type]
    services = offline_extender(build_services(settings), kube=kube, devices=devices)
    with TestClient(create_app(settings, services)) as api:
        capacity = {"cpu": "16", "memory": "32Gi", "gpu": 4}
        api.put(f"/v1/nodes/{NODE}", json={"capacity": capacity}).raise_for_status()
        api.app.state.test_services = services  # type: ignore[attr-defined]
        yield api


def bind(client: TestClient) -> str | None:
    args = {"PodName": "train", "PodNamespace": "ml", "PodUID": UID, "Node": NODE}
    answer = client.post("/v1/extender/bind", json=args)
    assert answer.status_code == 200, answer.text
    error: str | None = answer.json().get("Error") or None
    return error


def holding(client: TestClient) -> dict[str, Any] | None:
    rows = client.get("/v1/holdings", params={"node": NODE, "holder_kind": "pod"}).json()
    return next((row for row in rows if row["holder"]["id"] == UID), None)
