"""The Kubernetes API calls the service makes, on plain JSON (no generated models), with a
timeout on every call and one error type. Built on the official client's ApiClient so
kubeconfig, in-cluster tokens and TLS work as everywhere else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

GROUP = "nodeledger.io"
VERSION = "v1alpha1"
GENERICNODES = f"/apis/{GROUP}/{VERSION}/genericnodes"


class KubeError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeClient:
    def __init__(self, kubeconfig: Path | None, *, timeout: float = 10.0) -> None:
        if kubeconfig is not None:
            self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        else:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            self.api_client = client.ApiClient(configuration)
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        response = self._call(method, path, query, body, content_type, timeout or self.timeout)
        data = response.data
        return json.loads(data) if data else {}

    def list(self, path: str, **query: Any) -> tuple[list[dict[str, Any]], str]:
        body = self.request("GET", path, query=query)
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    def watch(
        self, path: str, resource_version: str, timeout: int, **query: Any
    ) -> Iterator[dict[str, Any]]:
        params = {
            **query,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
        }
        response = self._call("GET", path, params, None, "application/json", timeout + 10)
        try:
            for line in iter_resp_lines(response):
                if line:
                    yield json.loads(line)
        finally:
            response.release_conn()

    def bind(self, namespace: str, pod: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", body=body)

    def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.request(
            "PATCH",
            f"{path}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def _call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None,
        body: Any,
        content_type: str,
        timeout: float,
    ) -> Any:
        """The raw urllib3 response (not yet read) of a successful call."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            method, url, headers, body, post = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api_client.call_api(
                method, url, header_params=headers, body=body, post_params=post,
                _request_timeout=timeout,
            ).response  # fmt: skip
        except ApiException as exc:
            raise KubeError(
                f"{method} {path}: {exc.status} {_reason(exc.body, exc.reason)}", exc.status
            ) from exc
        except Exception as exc:  # urllib3 connection errors and timeouts
            raise KubeError(f"{method} {path}: {exc}") from exc
        if not 200 <= response.status <= 299:
            data = response.data
            raise KubeError(
                f"{method} {path}: {response.status} {_reason(data, response.reason)}",
                response.status,
            )
        return response


def _reason(body: Any, fallback: Any) -> str:
    try:
        return str(json.loads(body or "{}").get("message") or fallback)
    except (TypeError, ValueError):
        return str(fallback)
