"""Lost kubelets against the real kube-apiserver (issue 34): the controllers as the service
runs them (discovery, pod accounting, the hook between them), Nodes as plain API objects
whose Ready condition the test sets as the node lifecycle controller would.

A pod force-deleted while its node is NotReady keeps its holding; the out-of-service taint
releases it, the proof named in the release event. After a restart, a holding whose pod
went while the service was down stays while its node is lost, and goes with the Node."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from app.admission.service import Admissions
from app.core.records import EventKind, HolderKind
from app.db.engine import Database
from app.kube.client import KubeClient
from app.kube.controllers import KubeControllers
from app.kube.settings import KubeSettings
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import Metrics
from tests.kube.coloc import CRD
from tests.support.kube_cluster import KubeCluster, wait_until

pytestmark = pytest.mark.kube
LABEL = "nodeledger-test/lost-kubelets"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


class Service:
    """The Kubernetes controllers of one service process, on its own ledger."""

    def __init__(self, kube: KubeCluster, ledger: Ledger, tag: str) -> None:
        self.ledger = ledger
        self.registry = CollectorRegistry()
        settings = KubeSettings(
            enabled=True, kubeconfig=kube.kubeconfig, node_selector=f"{LABEL}={tag}",
            leader_election=False, binding_grace=1.0, cluster_name="lost",
        )  # fmt: skip
        self.controllers = KubeControllers(
            settings, KubeClient(kube.kubeconfig), Admissions(ledger), lambda _name: None,
            lambda: None, lambda: datetime.now(UTC), NodeSnapshot(ledger),
            metrics=Metrics(self.registry),
        )  # fmt: skip

    def __enter__(self) -> Service:
        self.controllers.start()
        wait_until(
            lambda: all(w.synced.is_set() for w in self.controllers.watches), 30, what="synced"
        )
        return self

    def __exit__(self, *_: object) -> None:
        self.controllers.stop()

    def orphaned(self) -> float | None:
        return self.registry.get_sample_value("nodeledger_kube_orphaned_pod_holdings")

    def held(self) -> set[str]:
        return {h.holder.id for h in self.ledger.list_holdings(kind=HolderKind.POD)}

    def released(self, uid: str) -> str | None:
        """The message of the pod's release event, None while it holds."""
        for event in self.ledger.events(after_id=0, limit=10_000):
            if event.kind is EventKind.RELEASED and event.holder_id == uid:
                return event.message
        return None


@pytest.fixture
def tag(kube_cluster: KubeCluster) -> Iterator[str]:
    """This test's label value: its Nodes carry it, its pods are named after it."""
    kube_cluster.apply(CRD.read_text())
    value = uuid.uuid4().hex[:8]
    yield value
    kube_cluster.kubectl(
        "delete", "pods", "-n", "default", "-l", f"{LABEL}={value}",
        "--grace-period=0", "--force", "--wait=false", check=False,
    )  # fmt: skip
    kube_cluster.kubectl("delete", "nodes", "-l", f"{LABEL}={value}", "--wait=false", check=False)


@pytest.fixture
def ledger(sqlite_url: str) -> Ledger:
    return Ledger(Database.from_url(sqlite_url))


def running_pod(kube: KubeCluster, name: str, node: str, tag: str) -> str:
    """A pod bound to ``node`` whose (absent) kubelet reported it running."""
    created = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {LABEL: tag}},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                    }
                ],
            },
        }
    )
    started = {"startedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    status: dict[str, Any] = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "c", "image": "registry.k8s.io/pause:3.10", "imageID": "",
                "ready": True, "restartCount": 0, "state": {"running": started},
            }
        ],
    }  # fmt: skip
    kube.patch_status("pod", name, status, "default")
    return str(created["metadata"]["uid"])


def set_ready(kube: KubeCluster, node: str, status: str) -> None:
    """What the node lifecycle controller writes when the kubelet stops posting (Unknown)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Ready", "status": status, "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    }  # fmt: skip
    kube.patch_status("node", node, {"conditions": [condition]})


def force_delete(kube: KubeCluster, name: str) -> None:
    kube.kubectl("delete", "pod", name, "-n", "default", "--grace-period=0", "--force")


def test_a_pod_force_deleted_on_a_lost_node_holds_until_the_out_of_service_taint(
    kube_cluster: KubeCluster, ledger: Ledger, tag: str
) -> None:
    kube = kube_cluster
    node, ready = f"lost-{tag}", f"ready-{tag}"
    kube.create_node(node, cpu=8, memory="16Gi", labels={LABEL: tag})
    kube.create_node(ready, cpu=8, memory="16Gi", labels={LABEL: tag})
    with Service(kube, ledger, tag) as service:
        gone = running_pod(kube, f"gone-{tag}", node, tag)
        stuck = running_pod(kube, f"stuck-{tag}", node, tag)
        elsewhere = running_pod(kube, f"elsewhere-{tag}", ready, tag)
        wait_until(lambda: service.held() == {gone, stuck, elsewhere}, 10, what="pods held")

        # The baseline: deleted on a Ready node, released as always.
        force_delete(kube, f"elsewhere-{tag}")
        wait_until(lambda: service.released(elsewhere), 10, what="released on a Ready node")
        assert (
            service.released(elsewhere) == "pod finished or deleted; proof: pod-deleted-node-ready"
        )

        set_ready(kube, node, "Unknown")
        wait_until(
            lambda: (h := service.controllers.discovery.health(node)) and not h.ready,
            10, what="the node seen NotReady",
        )  # fmt: skip
        force_delete(kube, f"gone-{tag}")  # its containers may still run on the lost node
        # A graceful delete: Terminating, waiting for a kubelet that does not answer.
        kube.kubectl("delete", "pod", f"stuck-{tag}", "-n", "default", "--wait=false")
        wait_until(lambda: service.orphaned() == 1, 10, what="an orphaned holding")
        assert service.held() == {gone, stuck}
        assert service.released(gone) is None

        kube.kubectl("taint", "node", node, OUT_OF_SERVICE)
        wait_until(lambda: service.released(gone), 10, what="released by the taint")
        assert service.released(gone) == "orphaned pod holding; proof: out-of-service-taint"
        assert service.orphaned() == 0
        assert service.held() == {stuck}  # still in the API: still holds
        force_delete(kube, f"stuck-{tag}")  # what the pod GC does after the taint
        wait_until(lambda: service.released(stuck), 10, what="the Terminating pod released")
        assert service.released(stuck) == "pod finished or deleted; proof: out-of-service-taint"


def test_after_a_restart_a_holding_on_a_lost_node_stays_until_the_node_is_deleted(
    kube_cluster: KubeCluster, ledger: Ledger, tag: str
) -> None:
    kube = kube_cluster
    node = f"lost-{tag}"
    kube.create_node(node, cpu=8, memory="16Gi", labels={LABEL: tag})
    with Service(kube, ledger, tag) as service:
        uid = running_pod(kube, f"p-{tag}", node, tag)
        wait_until(lambda: service.held() == {uid}, 10, what="pod held")
    # The service is down; the node is lost and the pod force-deleted meanwhile.
    set_ready(kube, node, "False")
    force_delete(kube, f"p-{tag}")
    with Service(kube, ledger, tag) as restarted:
        wait_until(lambda: restarted.orphaned() == 1, 10, what="kept by the resync")
        for _ in range(3):  # sweeps run every second, past the binding grace
            restarted.controllers.accounting.sweep()
        assert restarted.held() == {uid}
        kube.delete_node(node)
        wait_until(lambda: restarted.released(uid), 10, what="released with the Node")
        assert restarted.released(uid) == "orphaned pod holding; proof: node-deleted"
        # Released before discovery let the node go: it left the ledger, not cordoned.
        wait_until(lambda: node not in ledger.node_specs(), 10, what="the node gone")
