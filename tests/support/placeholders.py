"""The placeholder controller's fakes: a node's allocatable, a pods API that keeps what it
is asked to create and delete, and one pass of the controller."""

from __future__ import annotations

import threading
from typing import Any

from app.core import placeholder
from app.core.resources import Resources
from app.kube.client import KubeError
from app.kube.controllers.placeholders import Placeholders

GIB = 2**30


NODE = Resources(16000, 32 * GIB, 2)


class FakePods:
    """The placeholders' namespace as the API server keeps it; every call recorded."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.conflict = False

    def request(
        self, method: str, path: str, *, body: Any = None, content_type: str = "", **_: Any
    ) -> dict[str, Any]:
        name = path.rsplit("/", 2)[-2] if path.endswith("/resize") else path.rsplit("/", 1)[-1]
        self.calls.append((method, name if method != "POST" else body["metadata"]["name"]))
        if method == "POST":
            name = body["metadata"]["name"]
            if self.conflict or name in self.pods:
                raise KubeError("AlreadyExists", 409)
            self.pods[name] = body
        elif method == "PATCH":
            assert path.endswith("/resize")
            assert content_type == "application/strategic-merge-patch+json"
            if name not in self.pods:
                raise KubeError("NotFound", 404)
            requests = body["spec"]["containers"][0]["resources"]["requests"]
            self.pods[name]["spec"]["containers"][0]["resources"]["requests"] = requests
        elif method == "DELETE" and self.pods.pop(name, None) is None:
            raise KubeError("NotFound", 404)
        return {}

    def list(self, path: str, decode: Any, shape: Any = None, **query: Any) -> Any:
        if path == "/api/v1/nodes":
            return [], "1"  # none labelled refused (tests/kube/test_placeholder_policy.py)
        assert query == {"labelSelector": f"{placeholder.LABEL}=true"}
        return [decode(p) for p in self.pods.values()], "1"

    def requests(self, node: str) -> dict[str, str] | None:
        pod = self.pods.get(placeholder.pod_name(node))
        return None if pod is None else pod["spec"]["containers"][0]["resources"]["requests"]


def one_pass(placeholders: Placeholders) -> None:
    """One pass of the writer's loop (app.kube.controllers.placeholders.run)."""
    placeholders.snapshot.views(max_age=0)
    placeholders._retry_failed()
    placeholders.flush(threading.Event())
    placeholders._publish()
