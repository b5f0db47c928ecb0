"""Paginated lists and the watch that follows them, against the real kube-apiserver: a
list in pages smaller than the object count returns every object exactly once, all pages
are one snapshot, and the watch from that snapshot sees what came after, nothing twice."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.core.pods import PodShape
from app.kube.client import KubeClient
from app.kube.controllers.watch import ListWatch
from app.loops import Stop
from tests.support.kube_cluster import KubeCluster, wait_until
from tests.support.watch import PODS, Seen

pytestmark = [pytest.mark.kube, pytest.mark.kube_api]


class CountingClient(KubeClient):
    """The real client, remembering every request's method, path and query."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.pages: list[dict[str, Any]] = []  # list responses' metadata
        self.watched_from: list[str] = []

    def _call(self, method: str, path: str, query: dict[str, Any] | None, *args: Any) -> Any:
        self.requests.append((method, path, dict(query or {})))
        response = super()._call(method, path, query, *args)
        if method == "GET" and not (query or {}).get("watch"):
            self.pages.append(json.loads(response.data)["metadata"])
        return response

    def watch(
        self, path: str, resource_version: str, timeout: int, **query: Any
    ) -> Iterator[dict[str, Any]]:
        self.watched_from.append(resource_version)
        return super().watch(path, resource_version, timeout, **query)


def pod(name: str, label: str) -> dict[str, Any]:
    """Already bound (spec.nodeName set: no scheduler involved), never run (no kubelet)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"paging": label}},
        "spec": {
            "nodeName": "paging-node",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


@pytest.fixture
def label(kube_cluster: KubeCluster) -> Iterator[str]:
    """A label value only this test's pods carry (they are deleted afterwards)."""
    value = uuid.uuid4().hex[:10]
    yield value
    kube_cluster.kubectl(
        "delete", "pods", "-n", "default", "-l", f"paging={value}",
        "--grace-period=0", "--force", "--wait=false", check=False,
    )  # fmt: skip


def create_pods(kube: KubeCluster, label: str, names: list[str]) -> None:
    items = [pod(n, label) for n in names]
    kube.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )


def uid_and_name(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"]["uid"], obj["metadata"]["name"]


def test_a_list_in_small_pages_returns_every_object_once(
    kube_cluster: KubeCluster, label: str
) -> None:
    create_pods(kube_cluster, label, [f"p{i:02d}-{label}" for i in range(25)])
    client = CountingClient(kube_cluster.kubeconfig, page_size=4)
    items, version = client.list(PODS, uid_and_name, labelSelector=f"paging={label}")
    assert sorted(name for _, name in items) == [f"p{i:02d}-{label}" for i in range(25)]
    assert len({uid for uid, _ in items}) == 25
    assert len(client.requests) == 7  # ceil(25 / 4) pages
    assert [q.get("limit") for _, _, q in client.requests] == ["4"] * 7
    # Parsed into the pod accounting's shape: the fields it reads, nothing else.
    shaped, _ = client.list(PODS, lambda o: o, PodShape, labelSelector=f"paging={label}")
    assert set(shaped[0]) == {"metadata", "spec", "status"}
    assert set(shaped[0]["metadata"]) == {"uid", "name", "namespace"}
    assert shaped[0]["spec"]["nodeName"] == "paging-node"
    # One snapshot: every page has the resourceVersion the list returns.
    assert {p["resourceVersion"] for p in client.pages} == {version}
    assert not client.pages[-1].get("continue")


def test_the_watch_continues_from_the_paged_list_without_losing_or_repeating(
    kube_cluster: KubeCluster, label: str
) -> None:
    first = [f"w{i:02d}-{label}" for i in range(25)]
    create_pods(kube_cluster, label, first)
    client = CountingClient(kube_cluster.kubeconfig, page_size=4)
    seen, stop = Seen(), Stop()
    watch = ListWatch("pods", client, PODS, seen, watch_timeout=5, labelSelector=f"paging={label}")
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert watch.synced.wait(30)
        assert sorted(seen.listed) == first
        later = f"later-{label}"
        create_pods(kube_cluster, label, [later])  # created right after the list
        wait_until(lambda: ("ADDED", later) in seen.events, 15, what="the new pod's event")
        kube_cluster.delete_pod(first[0])
        wait_until(lambda: ("DELETED", first[0]) in seen.events, 15, what="the deletion")
    finally:
        stop.set()
        thread.join(15)
    added = [name for kind, name in seen.events if kind == "ADDED"]
    assert added == [later]  # none of the listed pods arrives again as ADDED
    assert client.watched_from[0] == client.pages[0]["resourceVersion"]
