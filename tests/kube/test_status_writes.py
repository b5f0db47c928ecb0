"""GenericNode status writes against the real kube-apiserver: a resync reads the
GenericNodes in pages and writes exactly the nodes whose figures differ from the ledger's
(none when nothing changed), counted by PATCH requests and by the metric; a change of the
Kubernetes headroom alone is one, and `kubectl get genericnode -o wide` shows it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from app.core.genericnode import new_object
from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.kube.client import GENERICNODES, KubeClient
from app.kube.controllers.mirror import StatusMirror
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import Metrics
from tests.kube.coloc import CRD
from tests.support.headroom import set_headroom
from tests.support.kube_cluster import KubeCluster

pytestmark = [pytest.mark.kube, pytest.mark.kube_api]
GIB = 2**30
NODES = 6


class CountingClient(KubeClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.patched: list[str] = []

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method in ("PATCH", "PUT"):
            self.patched.append(path.removeprefix(f"{GENERICNODES}/").removesuffix("/status"))
        return super().request(method, path, **kwargs)


@pytest.fixture
def names(kube_cluster: KubeCluster, sqlite_url: str) -> Iterator[list[str]]:
    """Ledger nodes, each with its GenericNode (as discovery would create them)."""
    kube_cluster.apply(CRD.read_text())
    prefix = f"sw-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-{i}" for i in range(NODES)]
    yield names
    for name in names:
        kube_cluster.delete("genericnode", name)


def resync(mirror: StatusMirror, client: CountingClient) -> list[str]:
    """The nodes one resync wrote."""
    before = len(client.patched)
    mirror.resync()
    mirror.flush(threading.Event())
    return sorted(client.patched[before:])


def test_a_resync_writes_exactly_the_changed_genericnodes(
    kube_cluster: KubeCluster, sqlite_url: str, names: list[str]
) -> None:
    ledger = Ledger(Database.from_url(sqlite_url))
    client = CountingClient(kube_cluster.kubeconfig, page_size=2)  # 3 pages of GenericNodes
    for name in names:
        view, _ = ledger.upsert_node(name, NodeSpec(capacity=Resources(16000, 32 * GIB)))
        client.request("POST", GENERICNODES, body=new_object(view, "lab"))
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    mirror = StatusMirror(
        NodeSnapshot(ledger), client, lambda: None, qps=100, burst=100, resync_period=3600,
        gpu_resource="nvidia.com/gpu", clock=lambda: now[0], metrics=metrics,
    )  # fmt: skip
    # Other tests' GenericNodes may exist: only this test's nodes are in its ledger.
    assert resync(mirror, client) == sorted(names)
    now[0] = datetime(2026, 1, 2, tzinfo=UTC)
    assert resync(mirror, client) == []
    ledger.admit(names[1], Holder(HolderKind.POD, "p1"), Resources(1500, GIB))
    ledger.upsert_node(names[4], NodeSpec(capacity=Resources(8000, 32 * GIB)))
    assert resync(mirror, client) == sorted([names[1], names[4]])
    assert resync(mirror, client) == []
    assert registry.get_sample_value("nodeledger_kube_status_writes_total") == NODES + 2

    status = (kube_cluster.get("genericnode", names[1]) or {})["status"]
    assert status["allocatedResources"][0]["allocated"]["cpu"] == "1500m"
    assert status["free"]["cpu"] == "14500m"
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # Ready never changed

    # The headroom alone changes (a push read back what Slurm withholds): that node only.
    # 2 CPUs and 2Gi kept for pods, 3500m and 3Gi granted, of which the pod holds 1500m, 1Gi.
    set_headroom(
        ledger, names[1], target=Resources(2000, 2 * GIB), granted=Resources(3500, 3 * GIB)
    )
    assert resync(mirror, client) == [names[1]]
    status = (kube_cluster.get("genericnode", names[1]) or {})["status"]
    assert status["headroom"] == {
        "target": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "0"},
        "granted": {"cpu": "3500m", "memory": "3Gi", "nvidia.com/gpu": "0"},
        "free": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "0"},
    }
    # kubectl get genericnode -o wide: the headroom's columns after the others.
    wide = kube_cluster.kubectl("get", "genericnode", names[1], names[2], "-o", "wide")
    header, *rows = [line.split() for line in wide.splitlines()]
    columns = "READY HEADROOM CPU HEADROOM FREE CPU HEADROOM MEM HEADROOM FREE MEM"
    assert " ".join(header).endswith(columns)
    shown = {row[0]: row[-4:] for row in rows}
    assert shown == {names[1]: ["2", "2", "2Gi", "2Gi"], names[2]: ["0", "0", "0", "0"]}
    narrow = kube_cluster.kubectl("get", "genericnode", names[1]).splitlines()[0]
    assert "HEADROOM" not in narrow  # priority 1: only with -o wide

    # A restarted service learns what Kubernetes has and writes nothing.
    fresh = CountingClient(kube_cluster.kubeconfig, page_size=2)
    restarted = StatusMirror(
        NodeSnapshot(ledger), fresh, lambda: None, qps=100, burst=100, resync_period=3600,
        gpu_resource="nvidia.com/gpu", clock=lambda: now[0],
    )  # fmt: skip
    assert resync(restarted, fresh) == []
