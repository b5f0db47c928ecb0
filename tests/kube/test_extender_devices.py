"""The extender's bind with co-managed DRA drivers (issue 23): a pod with claims is admitted
with the devices the scheduler allocated to them, read from its claims and the node's
ResourceSlices, with their UUIDs where the slices publish them; anything that keeps the
devices from being known is a bind error naming the claim (a UUID never is).
The Kubernetes API is a fake here, the ledger real (no Slurm gate: the hold job is
tests/gpu/test_gpu_bind.py's, on the real clusters)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.pods import PodInfo, pod_info
from app.core.records import HeldDevice, HolderKind
from app.kube.claims import PodDevices
from app.kube.client import KubeError
from app.kube.controllers.accounting import PodAccounting
from app.ledger.clock import utcnow
from tests.slurm.helpers import admit
from tests.support.extender import (
    DRIVER,
    NODE,
    SLICE,
    UID,
    FakeKube,
    allocated,
    bind,
    gpu_pod,
    holding,
    serve,
)


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def client(sqlite_url: str, kube: FakeKube) -> Iterator[TestClient]:
    yield from serve(sqlite_url, kube, {DRIVER, "other.example.com"})


def test_a_pod_is_admitted_with_its_claims_devices_then_bound(
    client: TestClient, kube: FakeKube
) -> None:
    assert bind(client) is None
    held = holding(client)
    assert held is not None
    assert held["devices"] == [{"index": 1, "uuid": "GPU-1"}]
    assert held["requests"]["gpu"] == 1
    assert kube.bound == [f"ml/train {NODE}"]
    assert kube.calls[1:] == [
        "claim ml/train-gpu",
        f"slices {NODE} ['gpu.example.com', 'other.example.com']",
    ]


def test_devices_of_several_claims_and_other_drivers(client: TestClient, kube: FakeKube) -> None:
    kube.pod = gpu_pod("a", "b", "nic")
    kube.claims = {
        "a": allocated("a", "gpu3"),
        "b": allocated("b", "gpu0", "gpu2"),
        "nic": allocated("nic", "eth0", driver="net.example.com"),
    }
    assert bind(client) is None
    held = holding(client)
    assert held is not None
    assert held["requests"]["gpu"] == 3
    devices = [(d["index"], d["uuid"]) for d in held["devices"]]
    assert devices == [(0, "GPU-0"), (2, "GPU-2"), (3, "")]  # gpu3 publishes none


@pytest.mark.parametrize(
    "uuid",
    [None, {"int": 7}, {"string": "GPU-" + "x" * 200}, {"string": "GPU-\t"}],
    ids=["missing", "not-a-string", "too-long", "not-printable"],
)
def test_a_device_without_a_usable_uuid_is_bound_all_the_same(
    client: TestClient, kube: FakeKube, uuid: dict[str, Any] | None
) -> None:
    attributes: dict[str, Any] = {"index": {"int": 1}}
    if uuid is not None:
        attributes["uuid"] = uuid
    kube.slices = [copy.deepcopy(SLICE)]
    kube.slices[0]["spec"]["devices"][1]["attributes"] = attributes
    assert bind(client) is None
    held = holding(client)
    assert held is not None
    assert held["devices"] == [{"index": 1, "uuid": ""}]
    assert kube.bound == [f"ml/train {NODE}"]


def test_a_device_another_holder_has_refuses_the_bind(client: TestClient, kube: FakeKube) -> None:
    other = admit(client, NODE, "uid-other", "1", gpu=1, devices=[1])
    assert other.status_code == 201, other.text
    error = bind(client)
    assert error is not None
    assert "GPU device 1 is held by pod default/uid-other" in error
    assert holding(client) is None
    assert kube.bound == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            lambda k: k.claims.update({"train-gpu": {"metadata": {"name": "train-gpu",
                                                                  "namespace": "ml"}}}),
            "ResourceClaim ml/train-gpu: not allocated yet", id="not-allocated",
        ),
        pytest.param(
            lambda k: k.claims.clear(),
            "ResourceClaim ml/train-gpu: not read: resourceclaims 'train-gpu' not found",
            id="claim-missing",
        ),
        pytest.param(
            lambda k: setattr(k, "claim_error", KubeError("GET ...: timed out")),
            "ResourceClaim ml/train-gpu: not read: GET ...: timed out", id="claim-read-fails",
        ),
        pytest.param(
            lambda k: setattr(k, "slices_error", KubeError("GET ...: 503 unavailable", 503)),
            "ResourceClaim ml/train-gpu: node 'kn3''s ResourceSlices not read", id="slices-fail",
        ),
        pytest.param(
            lambda k: setattr(k, "slices", []),
            "ResourceClaim ml/train-gpu: device 'gpu1' of driver gpu.example.com (pool 'kn3') "
            "is not in node 'kn3''s ResourceSlices", id="device-not-published",
        ),
        pytest.param(
            lambda k: setattr(k, "pod", gpu_pod("t", template=True)),
            "ResourceClaim ml/<e0>: generated from a template, not created yet",
            id="template-claim-not-generated",
        ),
        pytest.param(
            lambda k: setattr(k, "pod", gpu_pod("train-gpu", gpu=1)),
            "ResourceClaim ml/train-gpu: the pod also asks for 1 nvidia.com/gpu",
            id="counted-and-claimed",
        ),
    ],
)  # fmt: skip
def test_what_keeps_the_devices_unknown_is_a_bind_error_naming_the_claim(
    client: TestClient, kube: FakeKube, change: Any, message: str
) -> None:
    change(kube)
    error = bind(client)
    assert error is not None
    assert message in error
    assert holding(client) is None
    assert kube.bound == []


def test_a_pod_without_claims_is_bound_as_before(client: TestClient, kube: FakeKube) -> None:
    kube.pod = gpu_pod(gpu=2)
    assert bind(client) is None
    held = holding(client)
    assert held is not None
    assert (held["devices"], held["requests"]["gpu"]) == ([], 2)
    assert kube.calls == ["GET /api/v1/namespaces/ml/pods/train"]  # no DRA read


def test_claims_of_other_drivers_only_need_no_slice(client: TestClient, kube: FakeKube) -> None:
    kube.claims = {"train-gpu": allocated("train-gpu", "eth0", driver="net.example.com")}
    assert bind(client) is None
    held = holding(client)
    assert held is not None
    assert held["devices"] == []
    assert not any(c.startswith("slices") for c in kube.calls)


def test_without_drivers_claims_are_not_read(sqlite_url: str, kube: FakeKube) -> None:
    for api in serve(sqlite_url, kube, set()):
        assert bind(api) is None
        held = holding(api)
        assert held is not None
        assert (held["devices"], held["requests"]["gpu"]) == ([], 0)
        assert kube.calls == ["GET /api/v1/namespaces/ml/pods/train"]


def test_the_bound_pods_accounting_keeps_its_devices(client: TestClient, kube: FakeKube) -> None:
    """Once bound, the pod's watch event and a resync see requests without GPUs (its GPUs
    are its claims'): the holding the bind made, devices and all, stays."""
    assert bind(client) is None
    services = client.app.state.test_services  # type: ignore[attr-defined]
    accounting = PodAccounting(
        services.admissions, {NODE}.__contains__, gpu_resource="nvidia.com/gpu",
        binding_grace=30, clock=utcnow,
    )  # fmt: skip
    bound = copy.deepcopy(kube.pod)
    bound["spec"]["nodeName"] = NODE
    info = pod_info(bound)
    assert info.claims
    assert info.requests.gpus == 0
    mark = services.ledger.last_event_id()
    accounting.on_event("MODIFIED", info)
    accounting.resync([info])
    assert services.ledger.events(after_id=mark, limit=10) == []
    [kept] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert (kept.devices, kept.resources.gpus) == ((HeldDevice(1, "GPU-1"),), 1)


def claim_accounting(client: TestClient, kube: FakeKube) -> tuple[PodAccounting, PodInfo]:
    """Pod accounting that reads claims as the service wires it, and kube's pod, bound to
    NODE by another scheduler (no bind of ours)."""
    services = client.app.state.test_services  # type: ignore[attr-defined]
    accounting = PodAccounting(
        services.admissions, {NODE}.__contains__, gpu_resource="nvidia.com/gpu",
        binding_grace=30, clock=utcnow, claim_gpus=PodDevices(kube, {DRIVER}, "index").count,  # type: ignore[arg-type]
    )  # fmt: skip
    bound = copy.deepcopy(kube.pod)
    bound["spec"]["nodeName"] = NODE
    return accounting, pod_info(bound)


@pytest.mark.parametrize("path", ["event", "resync"])
def test_a_claim_pod_another_scheduler_bound_counts_its_claims_gpus(
    client: TestClient, kube: FakeKube, path: str
) -> None:
    """No bind of ours, so no holding: pod accounting records the pod with the co-managed
    GPUs its claims hold (here 2 of driver DRIVER, 1 of another driver left out), so they
    lower ``k8sgpu``; its requests alone count none (the finding of issue 30)."""
    kube.pod = gpu_pod("train-gpu", "nic")
    kube.claims = {
        "train-gpu": allocated("train-gpu", "gpu0", "gpu2"),
        "nic": allocated("nic", "eth0", driver="nic.example.com"),
    }
    services = client.app.state.test_services  # type: ignore[attr-defined]
    accounting, info = claim_accounting(client, kube)
    if path == "event":
        accounting.on_event("ADDED", info)
    else:
        accounting.resync([info])
    [held] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert (held.resources.cpu_millis, held.resources.gpus) == (1000, 2)
    # Recorded as it is: a later event or resync reads no claim again and writes nothing.
    kube.calls.clear()
    mark = services.ledger.last_event_id()
    accounting.on_event("MODIFIED", info)
    accounting.resync([info])
    assert services.ledger.events(after_id=mark, limit=10) == []
    assert not [c for c in kube.calls if c.startswith("claim")]


def test_a_claim_pod_whose_claims_cannot_be_read_is_counted_once_they_can(
    client: TestClient, kube: FakeKube
) -> None:
    services = client.app.state.test_services  # type: ignore[attr-defined]
    accounting, info = claim_accounting(client, kube)
    accounting.resync([])
    kube.claim_error = KubeError("the API server is away", status=503)
    accounting.on_event("ADDED", info)
    [held] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert held.resources.gpus == 0  # CPU and memory now; the GPUs once they can be read
    accounting.sweep()
    [held] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert held.resources.gpus == 0
    kube.claim_error = None
    accounting.sweep()
    [held] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert held.resources.gpus == 1
