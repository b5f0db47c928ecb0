"""Plain ``nvidia.com/gpu`` pods held by device (issue 33 item 3): kube-scheduler allocated
the request through DRA, in the claim it generated (``status.extendedResourceClaimStatus``,
KEP-5004); the bind and pod accounting read that claim as a pod's own, and count the
request once, as its devices. The pure parts as tables; the bind and accounting with a
fake Kubernetes API and a real ledger (tests/kube/test_extender_devices.py's); the
mapping check with a fake client. On real parts: tests/gpu/test_extended_resources.py."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from fastapi.testclient import TestClient

from app.core.claims import (
    EXTENDED_ENTRY,
    AllocatedDevice,
    ClaimDevicesError,
    ClaimRef,
    ExtendedClaim,
    extended_claim,
    gpus_counted_once,
    held_by_index,
    mapping_note,
    pod_claims,
)
from app.core.pods import PodShape, pod_info
from app.core.records import HeldDevice, HolderKind
from app.core.resources import Resources
from app.kube.claims import PodDevices
from app.kube.client import KubeError
from app.kube.controllers.accounting import PodAccounting
from app.kube.controllers.extended_resources import ExtendedResourceMapping
from app.ledger.clock import utcnow
from tests.support.extender import (
    DRIVER,
    NODE,
    UID,
    FakeKube,
    allocated,
    bind,
    gpu_pod,
    holding,
    serve,
)

GPU = "nvidia.com/gpu"
GENERATED = "train-gpu-extended-x7k2p"  # the scheduler's generated name


def mapped(pod: dict[str, Any], *resources: str, claim: str = GENERATED) -> dict[str, Any]:
    """``pod`` as kube-scheduler's PreBind leaves it: the claim it generated for the pod's
    extended ``resources`` named in the pod's status."""
    pod = copy.deepcopy(pod)
    mappings = [
        {"containerName": "c", "resourceName": r, "requestName": f"container-0-request-{i}"}
        for i, r in enumerate(resources)
    ]
    pod["status"]["extendedResourceClaimStatus"] = {
        "requestMappings": mappings,
        "resourceClaimName": claim,
    }
    return pod


def plain(gpu: int = 1) -> dict[str, Any]:
    """A pod asking GPUs by count, which the scheduler allocated through DRA."""
    return mapped(gpu_pod(gpu=gpu), GPU)


# ----------------------------------------------------------------------- pure: the claim


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param({}, None, id="none"),
        pytest.param(
            {"extendedResourceClaimStatus": {"resourceClaimName": "g", "requestMappings": [
                {"containerName": "c", "resourceName": GPU, "requestName": "r0"},
                {"containerName": "d", "resourceName": GPU, "requestName": "r1"},
                {"containerName": "d", "resourceName": "example.com/fpga", "requestName": "r2"},
            ]}},
            ExtendedClaim("g", frozenset({GPU, "example.com/fpga"})), id="mapped",
        ),
        pytest.param(
            {"extendedResourceClaimStatus": {"requestMappings": [{"resourceName": GPU}]}},
            None, id="no-name",
        ),
    ],
)  # fmt: skip
def test_extended_claim(status: dict[str, Any], expected: ExtendedClaim | None) -> None:
    assert extended_claim({"status": status}) == expected


def test_the_generated_claim_comes_after_the_pods_own() -> None:
    pod = mapped(gpu_pod("own"), GPU)
    assert pod_claims(pod) == (ClaimRef("e0", "own"), ClaimRef(EXTENDED_ENTRY, GENERATED))
    assert pod_claims(plain()) == (ClaimRef(EXTENDED_ENTRY, GENERATED),)


@pytest.mark.parametrize(
    ("pod", "counted", "claims"),
    [
        pytest.param(gpu_pod(gpu=2), 2, False, id="counted"),
        pytest.param(plain(2), 0, True, id="through-the-generated-claim"),
        pytest.param(mapped(gpu_pod(gpu=1), "example.com/fpga"), 1, True, id="other-resource"),
    ],
)
def test_a_gpu_request_through_the_generated_claim_is_not_counted(
    pod: dict[str, Any], counted: int, claims: bool
) -> None:
    info = pod_info(pod)
    assert info.requests == pod_info(gpu_pod(gpu=info.requests.gpus)).requests  # as asked
    assert (info.counted.gpus, info.claims) == (counted, claims)


def test_a_listed_pod_keeps_its_claims() -> None:
    """A LIST page is parsed into PodShape: the claim statuses are in it."""
    pod = mapped(gpu_pod("t", gpu=1, template=True), GPU)
    pod["status"]["resourceClaimStatuses"] = [{"name": "e0", "resourceClaimName": "t-e0-abc"}]
    listed = msgspec.json.decode(msgspec.json.encode(pod), type=PodShape)
    info = pod_info(listed)
    assert info.claim_refs == (ClaimRef("e0", "t-e0-abc"), ClaimRef(EXTENDED_ENTRY, GENERATED))
    assert (info.claims, info.extended_gpus, info.counted.gpus) == (True, True, 0)


def device(claim: str, index: int) -> AllocatedDevice:
    return AllocatedDevice(f"ml/{claim}", "r", DRIVER, NODE, f"gpu{index}", index)


@pytest.mark.parametrize(
    ("pod", "devices", "gpus"),
    [
        pytest.param(plain(1), [device(GENERATED, 2)], 1, id="one"),
        pytest.param(plain(2), [device(GENERATED, 0), device(GENERATED, 3)], 2, id="two"),
        pytest.param(
            mapped(gpu_pod("own", gpu=1), GPU), [device("own", 1), device(GENERATED, 2)], 2,
            id="own-claim-and-generated",
        ),
        pytest.param(gpu_pod("own"), [device("own", 1)], 1, id="own-claim-only"),
        pytest.param(gpu_pod(gpu=3), [], 3, id="counted"),
        pytest.param(mapped(gpu_pod(), "example.com/x"), [device(GENERATED, 1)], 1, id="other"),
    ],
)  # fmt: skip
def test_gpus_counted_once(pod: dict[str, Any], devices: list[AllocatedDevice], gpus: int) -> None:
    requests = pod_info(pod).requests
    counted = gpus_counted_once(requests, pod, devices, held_by_index(devices), GPU)
    assert counted == Resources(requests.cpu_millis, requests.memory_bytes, gpus)


@pytest.mark.parametrize(
    ("pod", "devices", "claim", "message"),
    [
        pytest.param(
            plain(2), [device(GENERATED, 0)], f"ml/{GENERATED}",
            "1 device(s) of a co-managed GPU driver allocated for the pod's 2 nvidia.com/gpu",
            id="fewer-co-managed-devices",
        ),
        pytest.param(
            plain(1), [], f"ml/{GENERATED}", "spec.extendedResourceName is nvidia.com/gpu",
            id="another-drivers-devices",
        ),
        pytest.param(
            mapped(gpu_pod(gpu=1), "example.com/x"), [device(GENERATED, 1)], f"ml/{GENERATED}",
            "the pod also asks for 1 nvidia.com/gpu", id="counted-and-claimed",
        ),
    ],
)  # fmt: skip
def test_doubt_about_the_generated_claim_names_it(
    pod: dict[str, Any], devices: list[AllocatedDevice], claim: str, message: str
) -> None:
    requests = pod_info(pod).requests
    with pytest.raises(ClaimDevicesError) as caught:
        gpus_counted_once(requests, pod, devices, held_by_index(devices), GPU)
    assert (caught.value.claim, caught.value.retryable) == (claim, False)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("classes", "names", "fallback"),
    [
        pytest.param([("a", GPU), ("b", "")], ("a",), False, id="mapped"),
        pytest.param([("b", ""), ("c", "example.com/x")], (), True, id="none"),
        pytest.param([], (), True, id="no-class"),
    ],
)
def test_mapping_note(
    classes: list[tuple[str, str]], names: tuple[str, ...], fallback: bool
) -> None:
    found, note = mapping_note(classes, GPU, "v1.35.4")
    assert found == names
    assert (note is not None) == fallback
    if note:
        assert note.startswith("plain nvidia.com/gpu pods counted, not held by device")
        assert "(v1.35.4)" in note


# ------------------------------------------------------------------------- the bind


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def client(sqlite_url: str, kube: FakeKube) -> Iterator[TestClient]:
    kube.pod = plain()
    kube.claims = {GENERATED: allocated(GENERATED, "gpu2")}
    yield from serve(sqlite_url, kube, {DRIVER})


def test_a_plain_gpu_pod_is_admitted_with_its_generated_claims_device(
    client: TestClient, kube: FakeKube
) -> None:
    assert bind(client) is None
    held = holding(client)
    assert held is not None
    assert held["devices"] == [{"index": 2, "uuid": "GPU-2"}]
    assert held["requests"]["gpu"] == 1  # the request is that device: counted once
    assert kube.bound == [f"ml/train {NODE}"]
    assert f"claim ml/{GENERATED}" in kube.calls


def test_a_second_plain_gpu_pod_on_a_held_device_is_refused(
    client: TestClient, kube: FakeKube
) -> None:
    assert bind(client) is None
    kube.pod["metadata"]["uid"] = "uid-second"
    args = {"PodName": "train", "PodNamespace": "ml", "PodUID": "uid-second", "Node": NODE}
    error = client.post("/v1/extender/bind", json=args).json().get("Error")
    assert "GPU device 2 is held by pod ml/train" in error


def test_a_generated_claim_of_another_driver_refuses_the_bind(
    client: TestClient, kube: FakeKube
) -> None:
    kube.claims = {GENERATED: allocated(GENERATED, "gpu2", driver="other.example.com")}
    error = bind(client)
    assert error is not None
    assert f"ResourceClaim ml/{GENERATED}: 0 device(s) of a co-managed GPU driver" in error
    assert holding(client) is None
    assert kube.bound == []


def test_without_drivers_a_plain_gpu_pod_stays_counted(sqlite_url: str, kube: FakeKube) -> None:
    kube.pod = plain()
    for api in serve(sqlite_url, kube, set()):
        assert bind(api) is None
        held = holding(api)
        assert held is not None
        assert (held["devices"], held["requests"]["gpu"]) == ([], 1)
        assert kube.calls == ["GET /api/v1/namespaces/ml/pods/train"]  # no DRA read


# ------------------------------------------------------------------- pod accounting


def accounting(client: TestClient, kube: FakeKube, *, identity: bool = True) -> PodAccounting:
    services = client.app.state.test_services  # type: ignore[attr-defined]
    counts = PodDevices(kube, {DRIVER}, "index").count if identity else None  # type: ignore[arg-type]
    return PodAccounting(
        services.admissions, {NODE}.__contains__, gpu_resource=GPU, binding_grace=30,
        clock=utcnow, claim_gpus=counts,
    )  # fmt: skip


def bound(kube: FakeKube) -> Any:
    pod = copy.deepcopy(kube.pod)
    pod["spec"]["nodeName"] = NODE
    return pod_info(pod)


def test_the_bound_plain_gpu_pods_accounting_keeps_its_device(
    client: TestClient, kube: FakeKube
) -> None:
    """After our bind, the watch event and a resync write nothing: the device stays."""
    assert bind(client) is None
    services = client.app.state.test_services  # type: ignore[attr-defined]
    mark = services.ledger.last_event_id()
    pods = accounting(client, kube)
    pods.on_event("MODIFIED", bound(kube))
    pods.resync([bound(kube)])
    assert services.ledger.events(after_id=mark, limit=10) == []
    [kept] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert (kept.devices, kept.resources.gpus) == ((HeldDevice(2, "GPU-2"),), 1)


@pytest.mark.parametrize("path", ["event", "resync"])
def test_a_plain_gpu_pod_another_scheduler_bound_counts_its_device_once(
    client: TestClient, kube: FakeKube, path: str
) -> None:
    kube.pod = plain(2)
    kube.claims = {GENERATED: allocated(GENERATED, "gpu0", "gpu3")}
    services = client.app.state.test_services  # type: ignore[attr-defined]
    pods = accounting(client, kube)
    if path == "event":
        pods.on_event("ADDED", bound(kube))
    else:
        pods.resync([bound(kube)])
    [held] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert held.resources.gpus == 2  # its two devices, not 2 + 2
    mark = services.ledger.last_event_id()
    pods.on_event("MODIFIED", bound(kube))
    pods.resync([bound(kube)])
    assert services.ledger.events(after_id=mark, limit=10) == []


def test_while_the_generated_claim_cannot_be_read_its_request_counts(
    client: TestClient, kube: FakeKube
) -> None:
    """Never fewer GPUs than asked: counted (as before) until the devices are read."""
    services = client.app.state.test_services  # type: ignore[attr-defined]
    pods = accounting(client, kube)
    pods.resync([])
    kube.claim_error = KubeError("the API server is away", status=503)
    pods.on_event("ADDED", bound(kube))
    [held] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert held.resources.gpus == 1
    kube.claim_error = None
    kube.claims = {GENERATED: allocated(GENERATED, "gpu1", "gpu2")}  # more than asked
    pods.sweep()
    [held] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert held.resources.gpus == 2


def test_without_gpu_identity_a_plain_gpu_pod_is_counted(
    client: TestClient, kube: FakeKube
) -> None:
    services = client.app.state.test_services  # type: ignore[attr-defined]
    pods = accounting(client, kube, identity=False)
    pods.resync([bound(kube)])
    [held] = services.ledger.holdings_of(HolderKind.POD, [UID])
    assert (held.devices, held.resources.gpus) == ((), 1)
    assert not [c for c in kube.calls if c.startswith("claim")]


# --------------------------------------------------------------------- the mapping check


class Classes:
    """The API's DeviceClasses and version, for ExtendedResourceMapping."""

    def __init__(self, *classes: dict[str, Any]) -> None:
        self.classes = list(classes)
        self.error: KubeError | None = None

    def list(self, path: str, decode: Any, shape: Any = None, **query: Any) -> Any:
        assert path == "/apis/resource.k8s.io/v1/deviceclasses"
        if self.error is not None:
            raise self.error
        return [decode(c) for c in self.classes], "1"

    def request(self, method: str, path: str) -> dict[str, Any]:
        assert (method, path) == ("GET", "/version")
        return {"gitVersion": "v1.35.4"}


def device_class(name: str, resource: str | None = None) -> dict[str, Any]:
    spec = {"extendedResourceName": resource} if resource else {}
    return {"metadata": {"name": name}, "spec": spec}


def test_the_mapping_is_told_once_and_in_the_note(caplog: pytest.LogCaptureFixture) -> None:
    api = Classes(device_class(DRIVER))
    check = ExtendedResourceMapping(api, gpu_resource=GPU, resync_period=300)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="app.kube.controllers.extended_resources"):
        check.step()
        check.step()
        assert check.note is not None
        assert "the API server (v1.35.4) has no DeviceClass" in check.note
        api.classes.append(device_class("gpu-extended", GPU))
        check.step()
        assert check.note is None
        api.error = KubeError("deviceclasses is forbidden", status=403)
        check.step()
        assert check.note == (
            "whether plain nvidia.com/gpu pods are held by device is unknown: "
            "deviceclasses is forbidden"
        )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines  # the fallback once, the class, the failure
    assert (
        lines[1]
        == "plain nvidia.com/gpu pods held by device through DeviceClass gpu-extended (KEP-5004)"
    )
