"""What the service is measured under: steady pod churn, and a burst of changes on many
nodes at once (each one GenericNode status write)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.kubescale.cluster import Api
from bench.kubescale.load import NAMESPACE, create_all, delete_pods, node_name, pod_object

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


async def churn(api: Api, nodes: int, rate: float, seconds: float) -> dict[str, Any]:
    """Create ``rate`` pods per second on nodes round-robin, and delete each 5 s after its
    creation (so about 5 x rate churn pods exist at a time); at the end delete the rest.
    Returns what was done and the nodes it touched."""
    created: list[tuple[float, str]] = []
    deleted = 0
    touched: set[str] = set()
    started = time.monotonic()
    k = 0
    while (now := time.monotonic()) - started < seconds:
        due = int((now - started) * rate) - k
        batch = []
        for _ in range(max(0, due)):
            node = node_name(k % nodes)
            batch.append(pod_object(f"churn-{k}", node))
            touched.add(node)
            k += 1
        old = [name for at, name in created if now - at >= 5]
        created = [(at, name) for at, name in created if now - at < 5]
        await asyncio.gather(create_all(api, "churn", PODS, batch), delete_pods(api, old))
        deleted += len(old)
        created += [(now, p["metadata"]["name"]) for p in batch]
        await asyncio.sleep(0.1)
    deleted += await delete_pods(api, [name for _, name in created])
    return {"created": k, "deleted": deleted, "nodes": sorted(touched)}


async def burst(api: Api, nodes: int, count: int) -> list[str]:
    """One new pod on each of ``count`` nodes at once: ``count`` nodes change together."""
    names = [node_name(i * max(1, nodes // count)) for i in range(count)]
    await create_all(api, "burst", PODS, (pod_object(f"burst-{n}", n) for n in names))
    return names


async def unburst(api: Api, names: list[str]) -> None:
    await delete_pods(api, [f"burst-{n}" for n in names])
