"""The real Kubernetes control plane the other Kubernetes tests rely on: the API server
answers, and the real default kube-scheduler binds pods to kubelet-less nodes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kube_cluster import KubeCluster, wait_until

pytestmark = [pytest.mark.kube, pytest.mark.kube_api]


@pytest.fixture
def node(kube_cluster: KubeCluster) -> Iterator[str]:
    """A fresh 4 CPU / 8Gi node; test pods select it by label, so other nodes don't matter."""
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    kube_cluster.create_node(name, cpu=4, memory="8Gi", labels={"nodeledger.io/test": name})
    yield name
    kube_cluster.delete_node(name)


def pod_on(node: str, name: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"nodeledger.io/test": node},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}},
                }
            ],
        },
    }


def test_kubectl_version_answers(kube_cluster: KubeCluster) -> None:
    version = json.loads(kube_cluster.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == kube_cluster.version
    assert kube_cluster.kubectl("get", "--raw", "/readyz").strip() == "ok"


def test_node_is_ready_untainted_with_allocatable(kube_cluster: KubeCluster, node: str) -> None:
    obj = kube_cluster.get("node", node)
    assert obj is not None
    assert obj["status"]["allocatable"]["cpu"] == "4"
    assert obj["status"]["allocatable"]["memory"] == "8Gi"
    assert not obj["spec"].get("taints")
    ready = [c for c in obj["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"


def test_default_scheduler_binds_then_pod_succeeds(kube_cluster: KubeCluster, node: str) -> None:
    pod = f"{node}-pod"
    kube_cluster.create(pod_on(node, pod, cpu="1"))
    try:
        assert kube_cluster.wait_bound(pod, timeout=60) == node
        bound = kube_cluster.pod(pod)
        assert bound is not None
        assert bound["spec"]["schedulerName"] == "default-scheduler"
        assert bound["status"]["phase"] == "Pending"  # no kubelet runs it

        kube_cluster.set_pod_phase(pod, "Succeeded")
        done = kube_cluster.pod(pod)
        assert done is not None
        assert done["status"]["phase"] == "Succeeded"
    finally:
        kube_cluster.delete_pod(pod)
    assert kube_cluster.pod(pod) is None


def test_pod_that_fits_nowhere_stays_unbound(kube_cluster: KubeCluster, node: str) -> None:
    pod = f"{node}-big"
    kube_cluster.create(pod_on(node, pod, cpu="5"))

    def unschedulable() -> bool:
        obj = kube_cluster.pod(pod) or {}
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in obj.get("status", {}).get("conditions", [])
        )

    try:
        wait_until(unschedulable, 60, 0.1, "PodScheduled=False/Unschedulable")
        assert kube_cluster.pod_node(pod) is None
    finally:
        kube_cluster.delete_pod(pod)
