"""A pod's effective request by Kubernetes' rules, what its kubelet allocated, the holding
of a pod resized in place, and whether its containers stopped (pure)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from app.core.pods import PodShape, pod_allocated, pod_info, pod_requests, resize
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


def named(name: str, container: dict[str, Any]) -> dict[str, Any]:
    return {**container, "name": name}


def status(name: str, allocated: dict[str, str] | None = None,
           applied: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    entry: dict[str, Any] = {"name": name}
    if allocated is not None:
        entry["allocatedResources"] = allocated
    if applied is not None:
        entry["resources"] = {"requests": applied}
    return entry


ALLOCATED_CASES = [
    ("no status yet", [], None),
    ("statuses without resources (an old kubelet)", [status("a")], None),
    ("as the spec", [status("a", {"cpu": "2", "memory": "1Gi"})], Resources(2100, 1124 * MI)),
    # The spec grew to 2 CPUs; the kubelet deferred it: it still allocates 1 (the sidecar
    # counts as its spec asks: 100m, 100Mi).
    ("a deferred growth", [status("a", {"cpu": "1"}, {"cpu": "1"})], Resources(1100, 1124 * MI)),
    # Admitted by the kubelet, not applied yet (or the reverse, a shrink): the larger.
    ("a resize in progress", [status("a", {"cpu": "3"}, {"cpu": "1"})], Resources(3100, 1124 * MI)),
    (
        "a sidecar's and an app's, by Kubernetes' rules",
        [status("a", {"cpu": "500m"}), status("s", {"cpu": "2"})],
        Resources(2500, 1124 * MI),
    ),
]


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [(s, e) for _, s, e in ALLOCATED_CASES],
    ids=[n for n, _, _ in ALLOCATED_CASES],
)
def test_pod_allocated(statuses: list[dict[str, Any]], expected: Resources | None) -> None:
    """What the kubelet allocated: its statuses' amounts over the spec's containers (a
    container it reports nothing of counts its spec)."""
    sidecar = named("s", c("100m", "100Mi", restart="Always"))
    pod = {
        "spec": {"containers": [named("a", c("2", "1Gi"))], "initContainers": [sidecar]},
        "status": {
            "containerStatuses": [s for s in statuses if s["name"] == "a"],
            "initContainerStatuses": [s for s in statuses if s["name"] == "s"],
        },
    }
    assert pod_allocated(pod) == expected
    # A listed page keeps what the kubelet allocated (the resync needs it), not the state.
    shaped = msgspec.json.decode(msgspec.json.encode(pod), type=PodShape)
    assert pod_allocated(shaped) == expected  # type: ignore[arg-type]
    assert pod_info(shaped).allocated == expected  # type: ignore[arg-type]


R = Resources
RESIZE_CASES = [
    # (held, wanted, allocated) -> (now, target)
    ("unchanged", (R(4000, MI), R(4000, MI), R(4000, MI)), (R(4000, MI), R(4000, MI))),
    # The kubelet defers the growth: held as it was until the difference is admitted.
    ("a growth", (R(4000, MI), R(8000, MI), R(4000, MI)), (R(4000, MI), R(8000, MI))),
    ("a growth, nothing reported", (R(4000, MI), R(8000, MI), None), (R(4000, MI), R(8000, MI))),
    # Applied by the kubelet without admission (placeholders off): held as it runs at once.
    ("applied already", (R(4000, MI), R(8000, MI), R(8000, MI)), (R(8000, MI), R(8000, MI))),
    ("applied in part", (R(4000, MI), R(8000, MI), R(6000, MI)), (R(6000, MI), R(8000, MI))),
    # A shrink goes at once, down to what the kubelet still allocates.
    ("a shrink applied", (R(8000, MI), R(4000, MI), R(4000, MI)), (R(4000, MI), R(4000, MI))),
    ("a shrink not applied", (R(8000, MI), R(4000, MI), R(8000, MI)), (R(8000, MI), R(8000, MI))),
    ("a shrink, nothing reported", (R(8000, MI), R(4000, MI), None), (R(4000, MI), R(4000, MI))),
    (
        "CPU grows while memory shrinks",
        (R(4000, 4 * MI), R(8000, MI), R(4000, MI)),
        (R(4000, MI), R(8000, MI)),
    ),
    # GPUs never shrink in place (its claims' devices are not in its requests).
    ("GPUs stay", (R(1000, MI, 2), R(2000, MI, 0), None), (R(1000, MI, 2), R(2000, MI, 2))),
    (
        "GPUs grow as any resource",
        (R(1000, MI, 0), R(1000, MI, 1), None),
        (R(1000, MI), R(1000, MI, 1)),
    ),
]


@pytest.mark.parametrize(
    ("given", "expected"), [(g, e) for _, g, e in RESIZE_CASES], ids=[n for n, _, _ in RESIZE_CASES]
)
def test_a_resized_pod_holds_the_larger_of_its_holding_and_its_allocation_until_admitted(
    given: tuple[Resources, Resources, Resources | None], expected: tuple[Resources, Resources]
) -> None:
    held, wanted, allocated = given
    plan = resize(held, wanted, allocated)
    assert (plan.now, plan.target) == expected
    floor = allocated or Resources.ZERO
    assert floor.fits_within(plan.now)
    assert plan.now.fits_within(plan.target)
    assert plan.growth.is_nonnegative()
    # Applying the plan changes nothing: the growth is the one thing left to admit.
    assert resize(plan.now, wanted, allocated) == plan
