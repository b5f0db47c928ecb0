"""Issue 33, item 4: a GPU pod really runs, with exactly the device it was allocated.

A Kubernetes cluster with one real node, n1, a GPU node (testenv/kube/nodes.sh,
NODELEDGER_KUBE_GPU_NODE): containerd 2.x, which injects CDI devices, and the DRA kubelet
plugin of four fake GPUs whose index and uuid attributes match the Slurm test cluster's n3
(gpu g0..g3, /dev/nvidia0..3). n1 is labelled as Slurm's n3, so the ledger's node n1 is
co-managed with it. A pod with a ResourceClaim, scheduled by the nodeledger profile (the
chart's configuration: the extender binds it once the device is held in Slurm by a hold
job), starts on n1 and its container sees its device only: the plugin's CDI edits
(NODELEDGER_GPU_<index>=<uuid>, /dev/nvidia<index>). ``sbatch --gres=gpu:1`` jobs on n3 get
the other three devices, never the pod's, and a fourth waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kube.coloc import CRD, scheduler_config
from tests.support import workers
from tests.support.gpu import (
    DRIVER,
    GPUS,
    SLURM_NODE,
    TEST_LABEL,
    device_class,
    gpu_claim,
    job_gpus,
)
from tests.support.kube_cluster import KubeCluster, cluster_sh
from tests.support.net import free_port
from tests.support.realenv import unavailable
from tests.support.service import ServiceProcess, running_service
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.kube, pytest.mark.deploy, pytest.mark.slow]

NODE = "n1"  # the kubelet node, and the ledger's node; Slurm's n3
SCHEDULER = "nodeledger"  # the chart's profile name
IMAGE = "registry.nodeledger.test/busybox:1.35"  # testenv/images, imported into the node
# Its own cluster beside the test control planes (only one cluster with nodes runs on a
# machine: tests/deploy's runs in its own module, before or after this one).
_BASE = os.environ.get("NODELEDGER_KUBE_PORT_BASE")
KUBE_ENV = {
    "NODELEDGER_RUNDIR": str(workers.main_rundir() / "gpu-node"),
    "NODELEDGER_KUBE_PORT_BASE": str(int(_BASE) + 40) if _BASE else "13500",
    "NODELEDGER_KUBE_NODES": "1",
    "NODELEDGER_KUBE_GPU_NODE": "1",
}


@pytest.fixture(scope="module")
def gpu_kube() -> Iterator[KubeCluster]:
    """The cluster with the GPU node; stopped after the module (it costs the rest of the
    suite nothing; a next run starts it again in about a minute, the builds cached)."""
    try:
        cluster_sh("up", timeout=1800, env=KUBE_ENV)  # `make testenv` built containerd
        kube = KubeCluster.from_env(KUBE_ENV)
    except Exception as exc:  # any failure to start means the cluster is unavailable
        with contextlib.suppress(Exception):
            cluster_sh("down", timeout=300, env=KUBE_ENV)
        unavailable("Kubernetes cluster with a GPU node", str(exc))
    # Co-managed with Slurm's n3, whose GPUs the plugin's devices are.
    kube.kubectl("label", "node", NODE, "--overwrite", f"nodeledger.io/slurm-node={SLURM_NODE}")
    yield kube
    cluster_sh("down", timeout=300, env=KUBE_ENV)


@dataclass
class GpuNode:
    kube: KubeCluster
    slurm: SlurmCluster
    service: ServiceProcess
    url: str

    def holding(self, uid: str) -> dict[str, Any] | None:
        rows = httpx.get(
            f"{self.url}/v1/holdings", params={"node": NODE, "holder_kind": "pod"}, timeout=30
        ).json()
        return next((row for row in rows if row["holder"]["id"] == uid), None)

    def device(self, name: str) -> dict[str, Any]:
        """A device as the plugin published it."""
        slices = self.kube.kubectl_json(
            "get", "resourceslices", "--field-selector", f"spec.nodeName={NODE}"
        )["items"]
        devices: dict[str, dict[str, Any]] = {
            d["name"]: d for s in slices for d in s["spec"]["devices"]
        }
        return devices[name]

    def allocated(self, claim: str) -> list[str]:
        found = self.kube.get("resourceclaim", claim, "default") or {}
        allocation = found.get("status", {}).get("allocation") or {}
        return [r["device"] for r in allocation.get("devices", {}).get("results", [])]

    def phase(self, pod: str) -> str:
        found = self.kube.pod(pod)
        return str(found["status"].get("phase", "")) if found else ""


def sweep(kube: KubeCluster) -> None:
    selector = ",".join(f"{k}={v}" for k, v in TEST_LABEL.items())
    kube.kubectl("delete", "pods", "-n", "default", "-l", selector,
                 "--grace-period=1", "--wait=true", check=False, timeout=120)  # fmt: skip
    kube.kubectl("delete", "resourceclaims", "-n", "default", "-l", selector,
                 "--wait=true", check=False, timeout=60)  # fmt: skip
    kube.kubectl("delete", "deviceclasses", "-l", selector, check=False)


@pytest.fixture
def gpu_node(
    gpu_kube: KubeCluster, slurm: SlurmCluster, sqlite_url: str, tmp_path: Path
) -> Iterator[GpuNode]:
    """`nodeledger serve` with the Kubernetes and Slurm integrations and the plugin's driver
    co-managed, and a kube-scheduler of the nodeledger profile calling its extender."""
    kube = gpu_kube
    sweep(kube)
    kube.apply(CRD.read_text())
    kube.create(device_class())
    env = {
        "NODELEDGER_LOG_LEVEL": "info",
        "NODELEDGER_KUBE_ENABLED": "true",
        "NODELEDGER_KUBE_KUBECONFIG": str(kube.kubeconfig),
        "NODELEDGER_KUBE_NODE_SELECTOR": "nodeledger.io/managed=true",
        "NODELEDGER_KUBE_CLUSTER_NAME": "lab",
        "NODELEDGER_KUBE_GPU_DRIVERS": DRIVER,
        **slurm.service_env,
    }
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = scheduler_config(tmp_path / "scheduler.yaml", kube, url)
    try:
        with running_service(sqlite_url, tmp_path, env=env, name="gpu-node", port=port) as svc:
            node = GpuNode(kube, slurm, svc, url)

            def discovered() -> bool:
                body: dict[str, Any] = httpx.get(f"{url}/v1/nodes/{NODE}", timeout=30).json()
                return body.get("name") == NODE and body["capacity"].get("gpu") == GPUS

            wait_until(discovered, 60, what=f"{NODE} discovered with Slurm's {GPUS} GPUs")
            kube.start_scheduler(SCHEDULER, config, free_port())
            yield node
    finally:
        with contextlib.suppress(Exception):
            kube.stop_scheduler(SCHEDULER)
        with contextlib.suppress(Exception):
            sweep(kube)
        kube.delete("genericnodes")


def gpu_pod(name: str, claim: str) -> dict[str, Any]:
    """Prints what the runtime gave it (the CDI edits), then sleeps."""
    script = "env | grep ^NODELEDGER_GPU_ | sort; ls /dev | grep ^nvidia; echo done; sleep 3600"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": TEST_LABEL},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi"},
                        "claims": [{"name": "gpu"}],
                    },
                }
            ],
        },
    }


def running(slurm: SlurmCluster, job: str) -> bool:
    return slurm.job_state(job) == "RUNNING"


def test_a_gpu_pod_runs_with_its_device_and_slurm_jobs_get_the_others(
    gpu_node: GpuNode,
) -> None:
    kube, slurm = gpu_node.kube, gpu_node.slurm
    name = f"gpu-run-{uuid.uuid4().hex[:8]}"
    kube.create(gpu_claim(name))
    started = time.perf_counter()
    uid = str(kube.create(gpu_pod(name, name))["metadata"]["uid"])

    # 1. The extender binds it once its device is held; the kubelet prepares the claim
    #    through the plugin and containerd injects the CDI device: the pod runs.
    assert kube.wait_bound(name, timeout=60) == NODE
    wait_until(lambda: gpu_node.phase(name) == "Running", 120, 0.5, what=f"pod {name} Running")
    running_after = time.perf_counter() - started
    [device] = gpu_node.allocated(name)
    attributes = gpu_node.device(device)["attributes"]
    index, gpu_uuid = attributes["index"]["int"], attributes["uuid"]["string"]

    # 2. Its container sees exactly that device: the environment and the device node.
    def output() -> str:
        out = kube.kubectl("logs", name, check=False)
        return out if "done" in out else ""

    logs = wait_until(output, 30, 0.5, what=f"pod {name}'s output")
    assert logs.split() == [f"NODELEDGER_GPU_{index}={gpu_uuid}", f"nvidia{index}", "done"], logs
    node_id = kube.kubectl("exec", name, "--", "stat", "-c", "%F %t:%T", f"/dev/nvidia{index}")
    assert node_id.strip() == f"character special file c3:{index:x}"  # 195:index, as in Slurm

    # 3. The ledger holds that device, in Slurm by a hold job on that index.
    held = gpu_node.holding(uid)
    assert held is not None, "running without a holding"
    assert held["devices"] == [{"index": index, "uuid": gpu_uuid}]
    hold = held["slurm_hold"]
    assert hold, held
    assert job_gpus(slurm, hold)[1] == {index}

    # 4. Slurm jobs asking for one GPU each on the same node get the other three devices,
    #    each its own; a fourth waits for one.
    jobs: dict[str, str] = {}
    for _ in range(GPUS):
        out = f"/srv/run/gpu-run-job-{uuid.uuid4().hex[:8]}"
        job = slurm.sbatch("-w", SLURM_NODE, "-c", "1", "--mem=100", "--gres=gpu:1",
                           "--wrap", f'echo "$CUDA_VISIBLE_DEVICES $SLURM_JOB_GPUS" >{out}; '
                           "sleep 600")  # fmt: skip
        jobs[job] = out
    *first, last = jobs
    job_indices: dict[str, int] = {}
    for job in first:
        wait_until(partial(running, slurm, job), 60, what=f"job {job} running")
        detail, indices = job_gpus(slurm, job)
        assert len(indices) == 1, detail
        [job_indices[job]] = indices
        seen = wait_until(partial(slurm.run, "cat", jobs[job], check=False), 10,
                          what=f"job {job}'s environment").strip()  # fmt: skip
        # slurmd's own view in the job, not only slurmctld's record.
        assert re.fullmatch(rf"(?:\S+ )?{job_indices[job]}", seen), seen
    assert sorted(job_indices.values()) == sorted(set(range(GPUS)) - {index}), job_indices
    time.sleep(3)  # a scheduling pass or two: the fourth job must still wait
    assert slurm.job_state(last) == "PENDING"
    assert gpu_node.phase(name) == "Running"
    print(
        "gpu pod runs: "
        + json.dumps(
            {
                "slurm": slurm.release,
                "kubernetes": kube.version,
                "pod": f"default/{name}",
                "device": device,
                "index": index,
                "uuid": gpu_uuid,
                "hold_job": hold,
                "jobs": job_indices,
                "pending": last,
                "create_to_running_s": round(running_after, 2),
            }
        )
    )
