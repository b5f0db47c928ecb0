"""The GPU node of the tests on real parts: gpu-1 (Slurm's n3, four devices), its DRA
devices, claims and pods on the Kubernetes side, Slurm's view of a job's devices, and the
`nodeledger serve` the GPU tests and benches run against it (tests/gpu, bench)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
import pytest
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from app.core.gres import gres_indices, split_items
from app.core.slurm_models import HOLD_COMMENT_PREFIX
from tests.kube.coloc import CRD, PLACEHOLDER_CONFIG, SCHEDULER_CONFIG, scheduler_config
from tests.support.kube_cluster import KubeCluster
from tests.support.net import free_port
from tests.support.realenv import unavailable
from tests.support.service import ServiceProcess, running_service
from tests.support.slurm_cluster import SlurmCluster, wait_until

NODE = "gpu-1"  # the ledger's node, the Kubernetes node of that name; Slurm's n3
SLURM_NODE = "n3"
GPUS = 4  # /dev/nvidia0-3 in the Slurm cluster (testenv/slurm/cluster.sh)
DRIVER = "gpu.nodeledger.test"  # the stand-in DRA driver: nothing runs behind it
RESOURCE = ("resource.k8s.io", "v1")
TEST_LABEL = {"nodeledger.io/test": "gpu-identity"}  # swept before and after
# Marks a claim kube-scheduler generated for a pod's extended resources (KEP-5004).
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"


class SharedGpu(AssertionError):
    """Two holders on one physical device: what hold jobs prevent. The xfail is for this only,
    any other failure (a component missing, a timeout) stays a failure."""


def gpu_indices(detail: str) -> set[int]:
    """The device indices in a job's GRES detail for one node, e.g. ``gpu:2(IDX:0,2)``,
    ``gpu:1(IDX:0-1)``, ``gpu:g0:1(IDX:0)``; other GRES (``k8scpu(CNT:2)``) ignored."""
    indices: set[int] = set()
    for item in split_items(detail):
        match = re.match(r"^gpu(?::[^(]*)?\(IDX:([^)]*)\)$", item)
        if not match:
            continue
        for part in filter(None, match.group(1).split(",")):
            first, _, last = part.partition("-")
            indices.update(range(int(first), int(last or first) + 1))
    return indices


def labelled(kind: str, name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(RESOURCE),
        "kind": kind,
        "metadata": {"name": name, "labels": TEST_LABEL, **meta},
        "spec": spec,
    }


def device_slice() -> dict[str, Any]:
    """The node's devices as a DRA driver publishes them: one pool, one slice."""
    devices = [
        {
            "name": f"gpu{i}",
            "attributes": {
                "index": {"int": i},
                "uuid": {"string": f"GPU-00000000-0000-0000-0000-{i:012d}"},
            },
        }
        for i in range(GPUS)
    ]
    spec = {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    return labelled("ResourceSlice", f"{NODE}-{DRIVER}", spec)


def device_class() -> dict[str, Any]:
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    return labelled("DeviceClass", DRIVER, {"selectors": [selector]})


def gpu_claim(name: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 1}}
    return labelled(
        "ResourceClaim", name, {"devices": {"requests": [request]}}, namespace="default"
    )


def gpu_pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": TEST_LABEL},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "claims": [{"name": "gpu"}],
                    },
                }
            ],
        },
    }


def sweep(kube: KubeCluster) -> None:
    """Remove what this test creates. Nothing else would: without a controller manager no
    one drops the claim's delete-protection finalizer the scheduler added, nor deletes the
    claims kube-scheduler generated for pods' extended resources (unlabelled, they name
    their pod as owner; an allocated claim left would keep its device from later tests)."""
    selector = ",".join(f"{k}={v}" for k, v in TEST_LABEL.items())
    kube.delete("pods", namespace="default", labels=selector, force=True)
    listed = kube.list("resourceclaims", "default")
    claims = [
        f"resourceclaim/{c['metadata']['name']}"
        for c in listed.get("items", [])
        if c["metadata"].get("labels", {}).items() >= TEST_LABEL.items()
        or c["metadata"].get("annotations", {}).get(EXTENDED_CLAIM) == "true"
    ]
    for claim in claims:
        kube.kubectl("patch", claim, "-n", "default", "--type=merge",
                     "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
        kube.kubectl("delete", claim, "-n", "default", "--wait=false", check=False)
    kube.delete("resourceslices", labels=selector)
    kube.kubectl("delete", "deviceclasses", "-l", selector, "--wait=false", check=False)
    kube.delete_node(NODE)
    wait_until(lambda: kube.get("node", NODE) is None, 30, what=f"node {NODE} gone")


@dataclass(frozen=True)
class DraNode:
    kube: KubeCluster
    api: Any  # kubernetes.client.ApiClient: the pod is created and its claim polled with it

    def allocate(self, name: str) -> tuple[dict[str, Any], float]:
        """A pod asking for one GPU through a ResourceClaim, scheduled by the real
        kube-scheduler: the claim's allocation result and seconds from the pod's creation to
        the allocation being visible."""
        # The official client: its objects as Any, its answers read as the JSON they are.
        custom: Any = kube_client.CustomObjectsApi(self.api)
        core: Any = kube_client.CoreV1Api(self.api)
        custom.create_namespaced_custom_object(
            *RESOURCE, "default", "resourceclaims", gpu_claim(name)
        )
        started = time.perf_counter()
        core.create_namespaced_pod("default", gpu_pod(name, name))

        def allocation() -> dict[str, Any] | None:
            claim = custom.get_namespaced_custom_object(
                *RESOURCE, "default", "resourceclaims", name
            )
            found: dict[str, Any] | None = claim.get("status", {}).get("allocation")
            return found

        found = wait_until(allocation, 30, 0.005, what=f"claim {name} allocated")
        assert found is not None  # wait_until returns a truthy value
        return found, time.perf_counter() - started

    def device(self, name: str) -> dict[str, Any]:
        """A device of the node's slice, as the API server has it."""
        published = self.kube.get("resourceslice", f"{NODE}-{DRIVER}")
        assert published is not None
        devices: dict[str, dict[str, Any]] = {d["name"]: d for d in published["spec"]["devices"]}
        return devices[name]


def job_gpus(slurm: SlurmCluster, job: str) -> tuple[str, set[int]]:
    """The job's GRES detail on its node as slurmrestd shows it, and the indices in it."""
    body = slurm.rest("GET", f"job/{job}").json()
    detail: list[str] = body["jobs"][0]["gres_detail"]
    return detail[0], gpu_indices(detail[0])


# The fix (each admission names its device, held in Slurm by a hold job) and the broken
# variant it is proven against (counted GPUs), which must keep failing, for that reason only.
IDENTIFIED_OR_COUNTED = pytest.mark.parametrize(
    "identified",
    [
        pytest.param(True, id="identified"),
        pytest.param(
            False,
            id="counted",
            marks=pytest.mark.xfail(
                strict=True, raises=SharedGpu, reason="counted GPUs collide (the broken variant)"
            ),
        ),
    ],
)


SCHEDULER = "nodeledger"  # the chart's profile name


@contextlib.contextmanager
def dra_gpu_node(kube: KubeCluster) -> Iterator[DraNode]:
    """Node gpu-1 with four GPUs published through DRA (a DeviceClass and a ResourceSlice)
    on ``kube``, swept afterwards (the benches set it up this way too)."""
    served = kube.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name")
    if "resourceslices.resource.k8s.io" not in served.split():
        unavailable("Kubernetes DRA (resource.k8s.io/v1)", f"the API server serves: {served!r}")
    sweep(kube)  # what a run that was killed left behind
    labels = {"nodeledger.io/slurm-node": SLURM_NODE, **TEST_LABEL}
    kube.create_node(NODE, cpu=16, memory="32000Mi", labels=labels)
    kube.create(device_class())
    kube.create(device_slice())
    api = kube_config.new_client_from_config(config_file=str(kube.kubeconfig))  # type: ignore[no-untyped-call]
    # The client's first call takes ~1 s here (it loads its models): not the scheduler's time.
    kube_client.CoreV1Api(api).list_namespaced_pod("default", limit=1)
    try:
        yield DraNode(kube, api)
    finally:
        api.close()
        with contextlib.suppress(Exception):
            sweep(kube)


@dataclass
class GpuService:
    """The service beside gpu-1's devices and the Slurm cluster."""

    dra: DraNode
    slurm: SlurmCluster
    service: ServiceProcess
    env: dict[str, str]

    @property
    def url(self) -> str:
        return self.service.url

    def node(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/v1/nodes/{NODE}", timeout=30).json()
        return body

    def holding(self, uid: str) -> dict[str, Any] | None:
        rows = httpx.get(
            f"{self.url}/v1/holdings", params={"node": NODE, "holder_kind": "pod"}, timeout=30
        ).json()
        return next((row for row in rows if row["holder"]["id"] == uid), None)


S = TypeVar("S", bound=GpuService)


def service_env(kube: KubeCluster, slurm: SlurmCluster, **extra: str) -> dict[str, str]:
    """The service's environment: both integrations, gpu-1's driver co-managed."""
    return {
        "NODELEDGER_LOG_LEVEL": "info",
        "NODELEDGER_KUBE_ENABLED": "true",
        "NODELEDGER_KUBE_KUBECONFIG": str(kube.kubeconfig),
        "NODELEDGER_KUBE_NODE_SELECTOR": ",".join(f"{k}={v}" for k, v in TEST_LABEL.items()),
        "NODELEDGER_KUBE_CLUSTER_NAME": "lab",
        "NODELEDGER_KUBE_GPU_DRIVERS": DRIVER,
        **slurm.service_env,
        **extra,
    }


@contextlib.contextmanager
def gpu_service(
    kind: type[S],
    dra: DraNode,
    slurm: SlurmCluster,
    sqlite_url: str,
    tmp_path: Path,
    *,
    name: str,
    scheduler: bool = False,
    placeholders: bool = False,
    **extra: str,
) -> Iterator[S]:
    """`nodeledger serve` (environment ``service_env`` and ``extra``) until gpu-1 is
    discovered with Slurm's GPUs, then (``scheduler``) the nodeledger kube-scheduler, with
    ``placeholders`` the chart's configuration for placeholder pods (it binds only)."""
    kube = dra.kube
    kube.apply(CRD.read_text())
    env = service_env(kube, slurm, **extra)
    env["NODELEDGER_KUBE_PLACEHOLDERS"] = str(placeholders).lower()
    port = free_port()
    try:
        with running_service(sqlite_url, tmp_path, env=env, name=name, port=port) as svc:
            found = kind(dra, slurm, svc, env)

            def discovered() -> bool:
                node = found.node()
                return node.get("name") == NODE and node["capacity"].get("gpu") == GPUS

            wait_until(discovered, 30, what=f"{NODE} discovered with Slurm's {GPUS} GPUs")
            if scheduler:
                source = PLACEHOLDER_CONFIG if placeholders else SCHEDULER_CONFIG
                [label] = TEST_LABEL.items()  # the service's node selector
                config = scheduler_config(
                    tmp_path / "scheduler.yaml", kube, svc.url, source, managed=label
                )
                kube.start_scheduler(SCHEDULER, config, free_port())
            yield found
    finally:
        if scheduler:
            with contextlib.suppress(Exception):
                kube.stop_scheduler(SCHEDULER)
        kube.delete("genericnodes")


OURS = "app.kubernetes.io/managed-by=nodeledger"


class Tainting(GpuService):
    def rules(self) -> dict[str, dict[str, Any]]:
        """Our DeviceTaintRules by name, as `kubectl get` shows them."""
        listed = self.dra.kube.list("devicetaintrules", labels=OURS)
        return {r["metadata"]["name"]: r for r in listed.get("items", [])}

    def gpus(self) -> list[dict[str, Any]]:
        """The GenericNode's status.gpus, as `kubectl get` shows it."""
        found = self.dra.kube.get("genericnode", NODE)
        assert found is not None, f"no GenericNode {NODE}"
        gpus: list[dict[str, Any]] = found.get("status", {}).get("gpus", [])
        return gpus


def skip_without_device_taints(dra: DraNode) -> None:
    kube = dra.kube
    served = kube.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "wide")
    if not any(
        line.split()[:1] == ["devicetaintrules"] and "resource.k8s.io/v1 " in line + " "
        for line in served.splitlines()
    ):
        pytest.skip(
            f"Kubernetes {kube.version} serves no resource.k8s.io/v1 DeviceTaintRule "
            "(GA in 1.37): the service falls back to no taints there"
        )


GPU = "nvidia.com/gpu"
CLASS = "gpu-extended"


def mapping_class() -> dict[str, Any]:
    """What a site creates (or the chart's kube.gpuDeviceClass): the co-managed driver's
    devices for plain nvidia.com/gpu requests."""
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    return labelled("DeviceClass", CLASS, {"selectors": [selector], "extendedResourceName": GPU})


def plain_pod(name: str, gpus: int = 1) -> dict[str, Any]:
    """A pod of the old shape: no claim, a GPU by count."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": TEST_LABEL},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {GPU: str(gpus)},
                    },
                }
            ],
        },
    }


class Contested(Protocol):
    def contested(self) -> bool: ...


class Going:
    """The race goes on for ``seconds``, and then until it was contested (a busy machine
    makes fewer rounds a second), at most ``limit`` seconds in all; it ends at once when
    ``failed`` says the run fails whatever comes next (a device seen shared: the broken
    variant has shown its collision, more racing proves nothing more)."""

    def __init__(
        self,
        race: Contested,
        seconds: float,
        *,
        limit: float,
        failed: Callable[[], bool] = lambda: False,
    ) -> None:
        start = time.monotonic()
        self.race, self.until, self.limit = race, start + seconds, start + limit
        self.failed = failed

    def __call__(self) -> bool:
        now = time.monotonic()
        if now >= self.limit or self.failed():
            return False
        return now < self.until or not self.race.contested()


def running_gpus(
    slurm: SlurmCluster, name: str = "gpu-race"
) -> tuple[dict[str, set[int]], dict[str, tuple[str, set[int]]]]:
    """Running jobs on the node: the devices of the race's jobs (named ``name``), and each
    other job's (a hold job's) holder and devices, from one slurmrestd listing."""
    jobs: dict[str, set[int]] = {}
    holds: dict[str, tuple[str, set[int]]] = {}
    for job in slurm.rest("GET", "jobs/").json()["jobs"]:
        if "RUNNING" not in job["job_state"] or job.get("nodes") != SLURM_NODE:
            continue
        indices = gpu_indices(job["gres_detail"][0]) if job.get("gres_detail") else set()
        if job["name"] == name:
            jobs[str(job["job_id"])] = indices
        else:
            holder = (job.get("comment") or "").removeprefix(HOLD_COMMENT_PREFIX)
            holds[str(job["job_id"])] = (holder, indices)
    return jobs, holds


def devices(slurm: SlurmCluster, job: str) -> tuple[int, ...]:
    """The GPU devices Slurm gave ``job``, from slurmrestd's gres_detail."""
    [detail] = slurm.rest("GET", f"job/{job}").json()["jobs"][0]["gres_detail"]
    return gres_indices(detail, "gpu")


def gpu_job(slurm: SlurmCluster, gres: str) -> str:
    """A Slurm job on n3 asking ``gres`` (e.g. ``gpu:1``), running for five minutes."""
    return slurm.sbatch(
        "-w", SLURM_NODE, "-c", "1", "--mem=100", f"--gres={gres}", "--wrap", "sleep 300"
    )
