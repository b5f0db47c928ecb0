"""Issue 23, the Kubernetes side: a GPU pod is bound only once the device kube-scheduler
allocated to its DRA claim is held in Slurm, on real parts.

The real kube-scheduler with nodeledger's extender (the chart's configuration) schedules a
pod with a ResourceClaim on node gpu-1 (Slurm's n3), whose four devices a ResourceSlice
publishes (tests/gpu/test_gpu_identity.py's DraNode). The scheduler allocates a device
(DynamicResources, written to the claim before the bind); the extender's bind reads the
claim and the slice, and the admission holds exactly that device in Slurm by a hold job
before the Binding is created. A device a Slurm job has refuses the bind: the scheduler
un-reserves the claim and tries again, and the pod binds once the job ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client

from tests.support.gpu import (
    NODE,
    RESOURCE,
    SCHEDULER,
    SLURM_NODE,
    DraNode,
    GpuService,
    gpu_claim,
    gpu_pod,
    gpu_service,
    job_gpus,
)
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.kube, pytest.mark.kube_api]


class GpuBind(GpuService):
    """The service with the nodeledger kube-scheduler, pods asking through claims."""

    def create(self, name: str) -> str:
        """A claim for one GPU and a pod using it, scheduled by the nodeledger scheduler;
        returns the pod's uid."""
        custom = kube_client.CustomObjectsApi(self.dra.api)
        custom.create_namespaced_custom_object(
            *RESOURCE, "default", "resourceclaims", gpu_claim(name)
        )
        pod = gpu_pod(name, name)
        pod["spec"]["schedulerName"] = SCHEDULER
        return str(self.dra.kube.create(pod)["metadata"]["uid"])

    def claim(self, name: str) -> dict[str, Any]:
        custom = kube_client.CustomObjectsApi(self.dra.api)
        found = custom.get_namespaced_custom_object(*RESOURCE, "default", "resourceclaims", name)
        assert isinstance(found, dict)
        return found

    def allocated(self, name: str) -> list[str]:
        """The devices allocated to the claim now ([] when it is not allocated)."""
        allocation = self.claim(name).get("status", {}).get("allocation") or {}
        return [r["device"] for r in allocation.get("devices", {}).get("results", [])]

    def reserved_for(self, name: str) -> set[str]:
        """The uids of the pods the claim is reserved for now."""
        reserved = self.claim(name).get("status", {}).get("reservedFor") or []
        return {str(r.get("uid")) for r in reserved}

    def index(self, device: str) -> int:
        value: int = self.dra.device(device)["attributes"]["index"]["int"]
        return value

    def uuid(self, device: str) -> str:
        """The device's uuid attribute, as its ResourceSlice publishes it."""
        value: str = self.dra.device(device)["attributes"]["uuid"]["string"]
        return value


@pytest.fixture
def gpu_bind(
    dra_node: DraNode, slurm: SlurmCluster, sqlite_url: str, tmp_path: Path
) -> Iterator[GpuBind]:
    """gpu-1 with its DRA devices, `nodeledger serve` with the Kubernetes and Slurm
    integrations and the co-managed driver, and a kube-scheduler calling its extender. The
    bind's refusal of a device a job has is what these tests show: the device taints
    (tests/gpu/test_device_taints.py) would keep the scheduler off it before."""
    off = {"NODELEDGER_KUBE_GPU_DEVICE_TAINTS": "false"}
    with gpu_service(
        GpuBind, dra_node, slurm, sqlite_url, tmp_path, name="gpu-bind", scheduler=True, **off
    ) as found:
        yield found


def started_at(slurm: SlurmCluster, job: str) -> int:
    body = slurm.rest("GET", f"job/{job}").json()["jobs"][0]
    start = body["start_time"]
    return int(start["number"] if isinstance(start, dict) else start)


def scheduled_at(pod: dict[str, Any]) -> int:
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "True":
            when = datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00"))
            return int(when.timestamp())
    raise AssertionError(f"pod not scheduled: {pod['status']}")


def test_a_gpu_pod_is_bound_only_once_its_device_is_held_in_slurm(gpu_bind: GpuBind) -> None:
    name = f"gpu-bind-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    uid = gpu_bind.create(name)
    assert gpu_bind.dra.kube.wait_bound(name, timeout=30) == NODE
    bound_after = time.perf_counter() - started

    [device] = gpu_bind.allocated(name)
    index = gpu_bind.index(device)
    held = gpu_bind.holding(uid)
    assert held is not None, "bound without a holding"
    gpu_uuid = gpu_bind.uuid(device)
    assert held["devices"] == [{"index": index, "uuid": gpu_uuid}]  # the UUID from the slice
    assert held["state"] == "held"
    hold = held["slurm_hold"]
    assert hold, held
    detail, indices = job_gpus(gpu_bind.slurm, hold)
    assert indices == {index}, detail
    assert f"gpu:g{index}:1(IDX:{index})" in detail
    # The hold started no later than the pod was scheduled (both in whole seconds).
    pod = gpu_bind.dra.kube.pod(name)
    assert pod is not None
    assert started_at(gpu_bind.slurm, hold) <= scheduled_at(pod)
    print(
        f"gpu bind: Slurm {gpu_bind.slurm.release}, Kubernetes {gpu_bind.dra.kube.version}: "
        f"pod default/{name} got {device} (index {index}, {gpu_uuid}), hold job {hold} "
        f"({detail}), "
        f"bound {bound_after * 1000:.0f} ms after its creation"
    )


def test_a_device_a_slurm_job_has_refuses_the_bind_until_the_job_ends(
    gpu_bind: GpuBind,
) -> None:
    slurm, kube = gpu_bind.slurm, gpu_bind.dra.kube
    # kube-scheduler allocates a node's devices lowest first (docs/gpu-identity.md): gpu0,
    # index 0. A Slurm job has that device.
    job = slurm.sbatch("-w", SLURM_NODE, "-c", "1", "--mem=100", "--gres=gpu:g0:1",
                       "--wrap", "sleep 600")  # fmt: skip
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 30, what=f"job {job} running")
    assert job_gpus(slurm, job)[1] == {0}

    name = f"gpu-refused-{uuid.uuid4().hex[:8]}"
    uid = gpu_bind.create(name)
    seen: set[str] = set()  # devices the claim was seen allocated
    unreserved = False  # the claim seen allocated but no longer reserved for the pod
    # Watched for 8 s at least, and until the scheduler was seen trying (a busy machine
    # makes its first try late), 120 s at most.
    start = time.monotonic()
    while time.monotonic() < start + 8 or not (seen and unreserved):
        assert time.monotonic() < start + 120, f"no refused try seen: {seen}, {unreserved}"
        assert kube.pod_node(name) is None, "bound while Slurm's job has its device"
        now = gpu_bind.allocated(name)
        seen.update(now)
        unreserved = unreserved or (bool(now) and uid not in gpu_bind.reserved_for(name))
        # Never held; a bind in flight is pending until Slurm refuses it.
        held = gpu_bind.holding(uid)
        assert held is None or held["state"] == "pending", held
        time.sleep(0.05)
    assert seen == {"gpu0"}, seen  # the scheduler tried the job's device, and only it
    # The refused bind's Unreserve took the pod off the claim's reservedFor, but not the
    # allocation (kube-controller-manager would not take it back either): each retry uses
    # the same device.
    assert unreserved, "the claim stayed reserved for the pod after the refused bind"
    assert kube.pod_node(name) is None
    events = json_events(gpu_bind, name)
    assert "GPU device 0" in events or "busy" in events, events

    slurm.scancel(job)
    assert kube.wait_bound(name, timeout=180) == NODE  # the scheduler backs off meanwhile
    held = gpu_bind.holding(uid)
    assert held is not None
    assert held["devices"] == [{"index": 0, "uuid": gpu_bind.uuid("gpu0")}]
    assert held["slurm_hold"]
    assert job_gpus(slurm, held["slurm_hold"])[1] == {0}
    assert gpu_bind.allocated(name) == ["gpu0"]
    print(f"gpu bind refused: Slurm {slurm.release}: job {job} had gpu0; events: {events}")


def json_events(gpu_bind: GpuBind, pod: str) -> str:
    out = gpu_bind.dra.kube.kubectl_json(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={pod}"
    )
    return " | ".join(e.get("message", "") for e in out["items"])
