"""Request bodies of the REST API shared by its tests: a node and a pod admission."""

from __future__ import annotations

from typing import Any

NODE = {"capacity": {"cpu": "8", "memory": "16Gi", "gpu": 2}, "reserved": {"cpu": "500m"}}


def pod(
    uid: str, cpu: Any = "1500m", memory: Any = "2Gi", gpu: Any = 0, node: str = "n1"
) -> dict[str, Any]:
    return {
        "node": node,
        "holder": {"kind": "pod", "namespace": "ns", "name": f"p-{uid}", "uid": uid},
        "requests": {"cpu": cpu, "memory": memory, "gpu": gpu},
    }
