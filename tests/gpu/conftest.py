"""Fixtures shared by the GPU tests on real parts: node gpu-1 with four devices published
through DRA (``dra_node``), and `nodeledger serve` with the Kubernetes and Slurm
integrations and the co-managed driver, gpu-1 discovered with Slurm's GPUs, optionally
with the nodeledger kube-scheduler calling its extender (``gpu_service``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from app.slurm.client import SlurmClient
from app.slurm.tokens import FileToken
from tests.gpu.test_gpu_identity import (
    DRIVER,
    GPUS,
    NODE,
    SLURM_NODE,
    TEST_LABEL,
    DraNode,
    device_class,
    device_slice,
    sweep,
)
from tests.kube.coloc import CRD, PLACEHOLDER_CONFIG, SCHEDULER_CONFIG, scheduler_config
from tests.support.kube_cluster import KubeCluster
from tests.support.net import free_port
from tests.support.realenv import unavailable
from tests.support.service import ServiceProcess, running_service
from tests.support.slurm_cluster import SlurmCluster, wait_until

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
    api = kube_config.new_client_from_config(config_file=str(kube.kubeconfig))
    # The client's first call takes ~1 s here (it loads its models): not the scheduler's time.
    kube_client.CoreV1Api(api).list_namespaced_pod("default", limit=1)
    try:
        yield DraNode(kube, api)
    finally:
        api.close()
        with contextlib.suppress(Exception):
            sweep(kube)


@pytest.fixture
def dra_node(kube_cluster: KubeCluster) -> Iterator[DraNode]:
    with dra_gpu_node(kube_cluster) as node:
        yield node


@pytest.fixture
def client(slurm: SlurmCluster) -> Iterator[SlurmClient]:
    """A client of the Slurm cluster's slurmrestd, as SlurmUser."""
    client = SlurmClient(slurm.url, FileToken(slurm.token_file), user_name=slurm.user)
    yield client
    client.close()


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
        kube.kubectl("delete", "genericnodes", "--all", check=False)
