"""Issue 33 item 3: plain ``nvidia.com/gpu`` pods held by device, on real parts.

A DeviceClass whose ``spec.extendedResourceName`` is ``nvidia.com/gpu`` (KEP-5004) selects
gpu-1's devices; gpu-1 does not advertise ``nvidia.com/gpu``, so the real kube-scheduler
allocates a pod's ``resources.limits: nvidia.com/gpu: 1`` through DRA: a claim it
generates, named in the pod's ``status.extendedResourceClaimStatus``. The nodeledger
scheduler's bind reads that claim as it reads a pod's own, and the admission holds exactly
that device in Slurm by a hold job; a second such pod gets another device, and a device a
Slurm job has is tainted (item 2), so the allocator keeps such pods off it too.

Kubernetes 1.35 serves no mapping (its DRAExtendedResource gate is alpha, off): the API
server drops the class's field, and the service says in /readyz that such pods stay
counted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.gpu import (
    CLASS,
    DRIVER,
    GPU,
    NODE,
    OURS,
    SLURM_NODE,
    DraNode,
    GpuService,
    Tainting,
    gpu_service,
    job_gpus,
    mapping_class,
    plain_pod,
    skip_without_device_taints,
)
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.kube]

FALLBACK = f"plain {GPU} pods counted, not held by device"


class PlainGpus(Tainting):
    def create(self, name: str) -> str:
        """A plain one-GPU pod; its uid."""
        return str(self.dra.kube.create(plain_pod(name))["metadata"]["uid"])

    def generated(self, name: str) -> dict[str, Any]:
        """The claim kube-scheduler generated for the pod, as the pod's status names it."""
        pod = self.dra.kube.pod(name)
        assert pod is not None
        status = pod["status"].get("extendedResourceClaimStatus")
        assert status, f"no extendedResourceClaimStatus: {pod['status']}"
        assert [(m["containerName"], m["resourceName"]) for m in status["requestMappings"]] == [
            ("main", GPU)
        ]
        claim = self.dra.kube.get("resourceclaim", status["resourceClaimName"], "default")
        assert claim is not None
        return claim

    def device(self, name: str) -> str:
        """The one device the pod's generated claim was allocated."""
        [result] = self.generated(name)["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (DRIVER, NODE)
        device: str = result["device"]
        return device

    def held_as(self, uid: str, device: str) -> str:
        """The pod's holding names exactly ``device`` (index and UUID from the slice) and a
        hold job has it in Slurm; the hold job's id."""
        held = self.holding(uid)
        assert held is not None, "bound without a holding"
        attributes = self.dra.device(device)["attributes"]
        index = attributes["index"]["int"]
        assert held["devices"] == [{"index": index, "uuid": attributes["uuid"]["string"]}]
        assert held["requests"]["gpu"] == 1  # counted once: the request is that device
        assert held["state"] == "held"
        hold: str = held["slurm_hold"]
        assert hold, held
        detail, indices = job_gpus(self.slurm, hold)
        assert indices == {index}, detail
        return hold

    def readiness(self) -> str:
        body = httpx.get(f"{self.url}/readyz", timeout=30).json()
        check: str = body["checks"].get("kubernetes", "")
        return check


@pytest.fixture
def plain(
    dra_node: DraNode, slurm: SlurmCluster, sqlite_url: str, tmp_path: Path
) -> Iterator[PlainGpus]:
    """The mapping DeviceClass, the service (device taints on) and the nodeledger scheduler."""
    skip_without_device_taints(dra_node)  # 1.37: the mapping (GA) and the taints
    kube = dra_node.kube
    kube.create(mapping_class())
    kube.delete("devicetaintrules", labels=OURS)
    try:
        with gpu_service(PlainGpus, dra_node, slurm, sqlite_url, tmp_path,
                         name="plain-gpus", scheduler=True) as found:  # fmt: skip
            yield found
    finally:
        kube.delete("devicetaintrules", labels=OURS)


def test_plain_gpu_pods_are_allocated_a_device_each_and_held_by_it(plain: PlainGpus) -> None:
    first, second = (f"plain-gpu-{i}-{uuid.uuid4().hex[:6]}" for i in (1, 2))
    started = time.perf_counter()
    uid = plain.create(first)
    assert plain.dra.kube.wait_bound(first, timeout=60) == NODE
    bound_after = time.perf_counter() - started
    device = plain.device(first)
    hold = plain.held_as(uid, device)

    other_uid = plain.create(second)
    assert plain.dra.kube.wait_bound(second, timeout=60) == NODE
    other = plain.device(second)
    assert other != device
    other_hold = plain.held_as(other_uid, other)
    assert other_hold != hold
    assert plain.node()["held_by_kubernetes"]["gpu"] == 2  # two devices, not four
    assert FALLBACK not in plain.readiness()
    assert f"held by device through DeviceClass {CLASS}" in plain.service.log()
    print(
        f"plain GPU pods: Slurm {plain.slurm.release}, Kubernetes {plain.dra.kube.version}: "
        f"{first} got {device} (hold job {hold}, bound {bound_after * 1000:.0f} ms after "
        f"its creation), {second} got {other} (hold job {other_hold})"
    )


def test_a_device_a_slurm_job_has_is_tainted_and_no_plain_gpu_pod_gets_it(
    plain: PlainGpus,
) -> None:
    slurm = plain.slurm
    rule = "nodeledger-gpu-1-g0"
    # kube-scheduler allocates lowest first: gpu0, were it not tainted for the job.
    job = slurm.sbatch("-w", SLURM_NODE, "-c", "1", "--mem=100", "--gres=gpu:g0:1",
                       "--wrap", "sleep 600")  # fmt: skip
    try:
        wait_until(lambda: slurm.job_state(job) == "RUNNING", 30, what=f"job {job} running")
        assert job_gpus(slurm, job)[1] == {0}
        wait_until(lambda: plain.rules().get(rule), 30, 0.05, what=f"rule {rule}")
        name = f"plain-tainted-{uuid.uuid4().hex[:6]}"
        uid = plain.create(name)
        assert plain.dra.kube.wait_bound(name, timeout=60) == NODE
        device = plain.device(name)
        assert device != "gpu0"
        hold = plain.held_as(uid, device)
        assert 0 not in job_gpus(slurm, hold)[1]
    finally:
        slurm.scancel(job)
    print(
        f"plain GPU pod beside a job: Slurm {slurm.release}: job {job} on gpu0 (rule {rule}); "
        f"pod {name} got {device}, hold job {hold}"
    )


@pytest.mark.kube_api
def test_whether_the_api_maps_plain_gpu_pods_is_told(
    dra_node: DraNode, slurm: SlurmCluster, sqlite_url: str, tmp_path: Path
) -> None:
    """Kubernetes 1.36 on keeps the class's extendedResourceName and the service says
    nothing; 1.35 drops it (DRAExtendedResource off), and the service says in /readyz and
    one log line that plain GPU pods stay counted."""
    kube = dra_node.kube
    kept = (kube.create(mapping_class()).get("spec") or {}).get("extendedResourceName")
    minor = tuple(int(p) for p in kube.version.lstrip("v").split(".")[:2])
    assert (kept == GPU) == (minor >= (1, 36)), (kube.version, kept)
    with gpu_service(GpuService, dra_node, slurm, sqlite_url, tmp_path, name="mapping") as svc:

        def told() -> str | None:
            checks = httpx.get(f"{svc.url}/readyz", timeout=30).json()["checks"]
            check: str = checks.get("kubernetes", "")
            return check if check.startswith("leading") else None

        wait_until(lambda: "DeviceClass" in svc.service.log(), 30, what="the mapping's line")
        check = wait_until(told, 30, what="the kubernetes component leading") or ""
        log = svc.service.log()
        if kept:
            assert FALLBACK not in check, check
            assert log.count(f"plain {GPU} pods held by device through DeviceClass {CLASS}") == 1
        else:
            assert FALLBACK in check, check
            assert f"the API server ({kube.version})" in check, check
            assert log.count(FALLBACK) == 1, log
    print(f"extended-resource mapping: Kubernetes {kube.version}: kept={kept!r}; /readyz: {check}")
