"""Issue 23: a pod and a Slurm job on one node, each given a GPU by its own scheduler, on
real parts.

The pod's device comes from Kubernetes' own allocation path, Dynamic Resource Allocation
(resource.k8s.io/v1): a ResourceSlice publishes the node's four devices, and the real
kube-scheduler allocates one to the pod's ResourceClaim. slurmd hands a ``--gres=gpu:1``
job a device by index, lowest first, as Slurm's own per-job GRES detail shows
(slurmrestd). Counted (``k8sgpu`` lowered, the counts right), nothing ties the two
choices together: both pick device 0.

No kubelet runs the pod (the control plane has no nodes): the device is the scheduler's
allocation in the claim's status, which is what the driver's kubelet plugin would prepare.

``test_a_pod_and_a_job_never_share_a_gpu[identified]`` is the fix: the admission names the
pod's device, the ledger holds exactly that device in Slurm by a hold job (app.slurm.holds),
and slurmd gives the job another. ``[counted]`` is the broken variant it is proven against,
today's design for a pod that names no device: it must keep failing (strict xfail, for that
reason only).
"""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from tests.slurm.helpers import admit, gres
from tests.support.gpu import (
    DRIVER,
    GPUS,
    IDENTIFIED_OR_COUNTED,
    NODE,
    SLURM_NODE,
    DraNode,
    SharedGpu,
    gpu_indices,
    job_gpus,
)
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.kube, pytest.mark.kube_api]

NVIDIA_MAJOR = 195


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ("gpu:1(IDX:0),k8scpu(CNT:2),k8smemory(CNT:100),k8sgpu(CNT:1)", {0}),
        ("gpu:3(IDX:0-1,3)", {0, 1, 3}),
        ("gpu:g0:0(IDX:),gpu:g1:1(IDX:1)", {1}),
        ("k8scpu(CNT:2)", set()),
        ("", set()),
    ],
)
def test_gpu_indices_reads_slurms_gres_detail(detail: str, expected: set[int]) -> None:
    assert gpu_indices(detail) == expected


# ---------------------------------------------------------------------------- Kubernetes


# ---------------------------------------------------------------------------- Slurm


def character_devices(slurm: SlurmCluster) -> dict[str, str]:
    """/dev/nvidiaN inside the Slurm cluster: file type and major:minor (hex)."""
    paths = [f"/dev/nvidia{i}" for i in range(GPUS)]
    out = slurm.run("stat", "-c", "%n %F %t:%T", *paths)
    return {line.split()[0]: line.split(" ", 1)[1] for line in out.splitlines() if line}


# ---------------------------------------------------------------------------- the test


@IDENTIFIED_OR_COUNTED
def test_a_pod_and_a_job_never_share_a_gpu(
    dra_node: DraNode, slurm_api: TestClient, slurm: SlurmCluster, identified: bool
) -> None:
    expected = {f"/dev/nvidia{i}": f"character special file c3:{i:x}" for i in range(GPUS)}
    assert character_devices(slurm) == expected  # major 195 = 0xc3, minor = index

    # Kubernetes: the scheduler allocates one of gpu-1's four devices to the pod's claim.
    pod = f"gpu-pod-{uuid.uuid4().hex[:8]}"
    allocation, latency = dra_node.allocate(pod)
    [result] = allocation["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, NODE)
    assert dra_node.kube.wait_bound(pod) == NODE
    attributes = dra_node.device(result["device"])["attributes"]
    pod_index = attributes["index"]["int"]
    scheduled = dra_node.kube.pod(pod)
    assert scheduled is not None
    uid = scheduled["metadata"]["uid"]

    # The ledger admits the pod's GPU. Identified: the device the scheduler allocated, held
    # in Slurm by a hold job. Counted (the broken variant): Slurm told that 3 of 4 remain.
    devices = [pod_index] if identified else None
    admitted = admit(slurm_api, NODE, uid, "1", "1Gi", gpu=1, devices=devices)
    assert admitted.status_code == 201, admitted.text
    if identified:
        hold = admitted.json()["slurm_hold"]
        assert [d["index"] for d in admitted.json()["devices"]] == [pod_index]
        assert hold
        assert job_gpus(slurm, hold)[1] == {pod_index}
    else:
        assert gres(slurm, SLURM_NODE)["k8sgpu"] == GPUS - 1

    # Slurm: a job asking for one GPU on the same node; slurmd picks the device.
    out = f"/srv/run/gpu-job-{uuid.uuid4().hex[:8]}"
    job = slurm.sbatch("-w", SLURM_NODE, "-c", "1", "--mem=100", "--gres=gpu:1",
                       "--wrap", f'echo "$SLURM_JOB_GPUS" >{out}; sleep 600')  # fmt: skip
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 30, what=f"job {job} running")
    detail, job_indices = job_gpus(slurm, job)
    assert len(job_indices) == 1, detail
    seen_by_job = wait_until(lambda: slurm.run("cat", out, check=False).strip(), 10,
                             what="the job's SLURM_JOB_GPUS")  # fmt: skip
    assert {int(i) for i in seen_by_job.split(",")} == job_indices

    holders: dict[int, list[str]] = {}
    holders.setdefault(pod_index, []).append(f"pod default/{pod}")
    for index in job_indices:
        holders.setdefault(index, []).append(f"Slurm job {job}")
    observed = (
        f"Slurm {slurm.release}, Kubernetes {dra_node.kube.version}: "
        f"pod default/{pod} got {result['device']} (index {pod_index}, "
        f"uuid {attributes['uuid']['string']}) from kube-scheduler, claim allocated "
        f"{latency * 1000:.0f} ms after the pod was created; ledger "
        f"{'held it by a hold job' if identified else 'counted it'} on {SLURM_NODE}; "
        f"Slurm job {job} got gres_detail {detail!r} "
        f"(SLURM_JOB_GPUS={seen_by_job})"
    )
    print(f"issue 23 observed: {observed}")
    shared = {index: names for index, names in holders.items() if len(names) > 1}
    if shared:
        raise SharedGpu(f"device index held twice {shared}: {observed}")
