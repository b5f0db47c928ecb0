"""Small helpers shared by the Slurm integration tests."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi.testclient import TestClient

from tests.support.slurm_cluster import SlurmCluster

MIB = 1024 * 1024


def admit(
    api: TestClient,
    node: str,
    uid: str,
    cpu: str,
    memory: str = "1Gi",
    gpu: int = 0,
    devices: list[int] | None = None,
) -> httpx.Response:
    """``devices``: the GPU devices the pod was given (their indices on the node)."""
    body: dict[str, Any] = {
        "node": node,
        "holder": {"kind": "pod", "namespace": "default", "name": uid, "uid": uid},
        "requests": {"cpu": cpu, "memory": memory, "gpu": gpu},
    }
    if devices is not None:
        body["devices"] = [{"index": d} for d in devices]
    return api.post("/v1/admissions", json=body)


def slurm_holdings(api: TestClient, node: str) -> dict[str, dict[str, Any]]:
    rows = api.get("/v1/holdings", params={"node": node, "holder_kind": "slurm_job"}).json()
    return {row["holder"]["id"]: row for row in rows}


def gres(cluster: SlurmCluster, node: str) -> dict[str, int]:
    return cluster.k8s_counts(node)


def events(api: TestClient, node: str, kind: str) -> list[dict[str, Any]]:
    return list(api.get("/v1/events", params={"node": node, "kind": kind, "limit": 1000}).json())
