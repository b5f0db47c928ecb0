"""Nodes and bound pods created fast: many requests in flight over a connection pool,
counted and timed (the API server's create rate on this machine is a result too)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

from bench.kubescale.cluster import Api

NAMESPACE = "kube-scale"
MANAGED = "nodeledger.io/managed"
PODS_PER_NODE = 10
POD_CPU_MILLIS = 100


def node_name(i: int) -> str:
    return f"bench-{i:05d}"


def node_object(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A kubelet-less Node: a Node's status may be set on create (a kubelet does so).
    ``labels``: more than the managed and hostname labels (e.g. its Slurm node's name)."""
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    every = {MANAGED: "true", "kubernetes.io/hostname": name, **(labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": every},
        "status": {"capacity": resources, "allocatable": resources},
    }


def pod_object(name: str, node: str) -> dict[str, Any]:
    """Bound from the start (spec.nodeName), so no scheduler is involved."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "kube-scale"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": f"{POD_CPU_MILLIS}m", "memory": "128Mi"}},
                }
            ],
        },
    }


async def create_all(
    api: Api, what: str, path: str, objects: Iterable[dict[str, Any]]
) -> dict[str, Any]:
    """POST every object with ``api.concurrency`` requests in flight; 409 counts as there."""
    todo = iter(objects)
    counts = {"created": 0, "existed": 0, "failed": 0}
    errors: list[str] = []
    started = time.monotonic()

    async def worker() -> None:
        for obj in todo:
            for attempt in range(5):
                status, body = await api.call("POST", path, obj)
                if status == 201:
                    counts["created"] += 1
                elif status == 409:
                    counts["existed"] += 1
                elif status in (429, 500, 503, 504) and attempt < 4:
                    await asyncio.sleep(0.5 * (attempt + 1))
                    continue
                else:
                    counts["failed"] += 1
                    errors.append(f"{status} {str(body)[:200]}")
                break
            done = counts["created"] + counts["existed"]
            if done and done % 10_000 == 0:
                rate = done / (time.monotonic() - started)
                print(f"kube-scale: {what}: {done} ({rate:.0f}/s)", file=sys.stderr)

    await asyncio.gather(*(worker() for _ in range(api.concurrency)))
    seconds = time.monotonic() - started
    return {
        **counts,
        "seconds": round(seconds, 1),
        "per_second": round(counts["created"] / seconds, 1) if seconds else 0.0,
        "errors": errors[:5],
    }


async def load(api: Api, nodes: int) -> dict[str, Any]:
    """Make the cluster hold nodes bench-00000.. bench-<nodes-1>, 10 bound pods each
    (what is there from an earlier, smaller run is kept)."""
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    have_nodes = await api.count("/api/v1/nodes")
    have_pods = await api.count(f"/api/v1/namespaces/{NAMESPACE}/pods")
    result: dict[str, Any] = {"nodes_before": have_nodes, "pods_before": have_pods}
    names = [node_name(i) for i in range(nodes)]
    if have_nodes < nodes:
        result["nodes"] = await create_all(
            api, "nodes", "/api/v1/nodes", (node_object(n) for n in names[have_nodes:])
        )
    if have_pods < nodes * PODS_PER_NODE:
        # Pods of nodes that were fully loaded before are skipped, the rest posted (409: there).
        first = min(have_nodes, have_pods // PODS_PER_NODE)
        pods = (pod_object(f"{n}-{k}", n) for n in names[first:] for k in range(PODS_PER_NODE))
        result["pods"] = await create_all(api, "pods", f"/api/v1/namespaces/{NAMESPACE}/pods", pods)
    result["nodes_after"] = await api.count("/api/v1/nodes")
    result["pods_after"] = await api.count(f"/api/v1/namespaces/{NAMESPACE}/pods")
    return result


async def delete_pods(api: Api, names: Iterable[str]) -> int:
    """Gone at once (no kubelet would confirm a graceful deletion)."""
    body = {"gracePeriodSeconds": 0}
    todo = iter(names)
    deleted = 0

    async def worker() -> None:
        nonlocal deleted
        for name in todo:
            path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
            status, _ = await api.call("DELETE", path, body)
            deleted += status in (200, 202)

    await asyncio.gather(*(worker() for _ in range(api.concurrency)))
    return deleted
