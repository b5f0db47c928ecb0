"""A pod's effective request by Kubernetes' rules, and whether its containers stopped
(pure)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from app.core.pods import PodShape, pod_info, pod_requests
from app.core.resources import Resources

MI = 2**20


def c(cpu: str | None = None, memory: str | None = None, *, limits: dict[str, Any] | None = None,
      restart: str | None = None, gpu: int | None = None) -> dict[str, Any]:  # fmt: skip
    requests: dict[str, Any] = {}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    if gpu is not None:
        requests["nvidia.com/gpu"] = str(gpu)
    container: dict[str, Any] = {"name": "c", "resources": {"requests": requests}}
    if limits:
        container["resources"]["limits"] = limits
    if restart:
        container["restartPolicy"] = restart
    return container


CASES = [
    ("one container", {"containers": [c("250m", "64Mi")]}, Resources(250, 64 * MI)),
    (
        "apps add up",
        {"containers": [c("1", "1Gi"), c("500m", "512Mi")]},
        Resources(1500, 1536 * MI),
    ),
    (
        "a big init container wins",
        {"initContainers": [c("4", "100Mi")], "containers": [c("1", "1Gi")]},
        Resources(4000, 1024 * MI),
    ),
    (
        "sidecars run next to apps and later init containers",
        {
            "initContainers": [c("500m", "100Mi", restart="Always"), c("2", "50Mi")],
            "containers": [c("1", "200Mi")],
        },
        Resources(2500, 300 * MI),
    ),
    (
        "overhead is added",
        {"containers": [c("1", "1Gi")], "overhead": {"cpu": "250m", "memory": "120Mi"}},
        Resources(1250, 1144 * MI),
    ),
    (
        "limits stand in for missing requests",
        {"containers": [c(limits={"cpu": "2", "memory": "1Gi"})]},
        Resources(2000, 1024 * MI),
    ),
    ("gpus", {"containers": [c("1", gpu=2), c("1", gpu=1)]}, Resources(2000, 0, 3)),
    (
        "pod-level requests replace the container sum for what they name",
        {"containers": [c("1", "1Gi")], "resources": {"requests": {"cpu": "3"}}},
        Resources(3000, 1024 * MI),
    ),
    ("no requests at all", {"containers": [{"name": "c"}]}, Resources.ZERO),
]


@pytest.mark.parametrize(
    ("spec", "expected"), [(s, e) for _, s, e in CASES], ids=[n for n, _, _ in CASES]
)
def test_pod_requests(spec: dict[str, Any], expected: Resources) -> None:
    assert pod_requests({"spec": spec}) == expected


def test_pod_info_says_whether_it_holds() -> None:
    pod = {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "p"},
        "spec": {"nodeName": "n1", "containers": [c("1")]},
        "status": {"phase": "Running"},
    }
    info = pod_info(pod)
    assert info.holds
    assert info.display_name == "ns/p"
    assert not pod_info({**pod, "status": {"phase": "Succeeded"}}).holds
    assert not pod_info({**pod, "spec": {"containers": []}}).holds  # not bound yet


RUNNING = {"state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
DONE = {"state": {"terminated": {"exitCode": 0}}}
WAITING = {"state": {"waiting": {"reason": "ContainerCreating"}}}
STOPPED_CASES = [
    ("no status yet", {}, False),
    ("every container terminated", {"containerStatuses": [DONE, DONE]}, True),
    ("one still running", {"containerStatuses": [DONE, RUNNING]}, False),
    ("one waiting to start", {"containerStatuses": [DONE, WAITING]}, False),
    (
        "a sidecar still running",
        {"initContainerStatuses": [RUNNING], "containerStatuses": [DONE]},
        False,
    ),
    (
        "an ephemeral container still running",
        {"containerStatuses": [DONE], "ephemeralContainerStatuses": [RUNNING]},
        False,
    ),
    (
        "init, app and ephemeral all terminated",
        {
            "initContainerStatuses": [DONE],
            "containerStatuses": [DONE],
            "ephemeralContainerStatuses": [DONE],
        },
        True,
    ),
    (
        "only the last state terminated",
        {"containerStatuses": [{**RUNNING, "lastState": DONE["state"]}]},
        False,
    ),
]


@pytest.mark.parametrize(
    ("status", "expected"),
    [(s, e) for _, s, e in STOPPED_CASES],
    ids=[n for n, _, _ in STOPPED_CASES],
)
def test_pod_info_says_whether_its_containers_stopped(
    status: dict[str, Any], expected: bool
) -> None:
    pod = {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "p"},
        "spec": {"nodeName": "n1", "containers": [c("1")]},
        "status": {"phase": "Running", **status},
    }
    assert pod_info(pod).stopped is expected
    # A listed page is parsed without the statuses (a listed pod is there: they decide
    # nothing); the DELETED event that does need them carries the whole object.
    shaped = msgspec.json.decode(msgspec.json.encode(pod), type=PodShape)
    assert pod_info(shaped).stopped is False  # type: ignore[arg-type]
