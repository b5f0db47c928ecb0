"""The tests' plumbing reads and writes to a test control plane, in process over HTTP.

A kubectl run costs ~70 ms of CPU (a Go binary starting, reading its kubeconfig and the
discovery cache) for what is one request; the suite's polling loops and fixtures send
thousands. This client sends those requests itself on one kept-alive connection, for the
kinds in :data:`KINDS` only: everything else, and whatever a test checks *as kubectl's
output* (columns, drain, cordon, auth can-i), still goes through kubectl.

Objects come back as kubectl's ``-o json`` gives them: a list's items carry their
apiVersion and kind (the API leaves them out of a typed list's items).
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

__all__ = ["KINDS", "KubeHttp", "Resource", "resource"]


@dataclass(frozen=True)
class Resource:
    api_version: str  # "v1" (the core group) or "group/version"
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        ns = f"/namespaces/{namespace or 'default'}" if self.namespaced else ""
        return f"{prefix}{ns}/{self.plural}" + (f"/{name}" if name else "")


_GENERIC_NODES = Resource("nodeledger.io/v1alpha1", "genericnodes", namespaced=False)
_RESOURCES = (
    Resource("v1", "nodes", namespaced=False),
    Resource("v1", "pods", namespaced=True),
    Resource("v1", "namespaces", namespaced=False),
    Resource("v1", "events", namespaced=True),
    Resource("coordination.k8s.io/v1", "leases", namespaced=True),
    _GENERIC_NODES,
    Resource("resource.k8s.io/v1", "resourceslices", namespaced=False),
    Resource("resource.k8s.io/v1", "resourceclaims", namespaced=True),
    Resource("resource.k8s.io/v1", "devicetaintrules", namespaced=False),
)
# The names tests give a kind (kubectl's plural, singular and short names) -> its resource.
KINDS: dict[str, Resource] = {
    **{r.plural: r for r in _RESOURCES},
    **{r.plural.removesuffix("s"): r for r in _RESOURCES},
    "gn": _GENERIC_NODES,
}


def resource(kind: str, api_version: str | None = None) -> Resource | None:
    """The table's resource for ``kind`` (any case), None when kubectl must serve it; with
    ``api_version`` (a manifest's), only when the table's version is that one."""
    found = KINDS.get(kind.lower())
    if found is None or (api_version is not None and api_version != found.api_version):
        return None
    return found


def _tls(user: Mapping[str, Any], cluster: Mapping[str, Any]) -> ssl.SSLContext:
    """The CA and client certificate, from the kubeconfig's files or inline data (ssl only
    loads a certificate chain from files: inline ones pass through a private temp dir)."""
    if "certificate-authority-data" in cluster:
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        context = ssl.create_default_context(cadata=ca)
    else:
        context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    if "client-certificate-data" in user:
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            context.load_cert_chain(cert, key)
    else:
        context.load_cert_chain(user["client-certificate"], user["client-key"])
    return context


def _client(kubeconfig: Path) -> httpx.Client:
    config = yaml.safe_load(kubeconfig.read_text())
    contexts = {c["name"]: c["context"] for c in config["contexts"]}
    current = contexts[config["current-context"]]
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == current["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == current["user"])
    return httpx.Client(
        base_url=cluster["server"], verify=_tls(user, cluster), timeout=httpx.Timeout(60)
    )


class KubeHttp:
    """One kept-alive client to the API server of ``kubeconfig``, opened at first use;
    tests send through it from several threads at once (httpx.Client is thread-safe)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = _client(self.kubeconfig)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        missing_ok: bool = False,
    ) -> dict[str, Any] | None:
        """The response's object; None for a 404 when ``missing_ok``; RuntimeError with
        the API's message for any other failure (as a failed kubectl raised)."""
        response = self.client().request(
            method,
            path,
            params=params,
            content=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type},
        )
        if response.status_code == 404 and missing_ok:
            return None
        if response.is_error:
            try:
                message = response.json().get("message", response.text)
            except ValueError:
                message = response.text
            raise RuntimeError(f"{method} {path} failed ({response.status_code}): {message}")
        found: dict[str, Any] = response.json()
        if found.get("kind", "").endswith("List"):
            item_kind = found["kind"].removesuffix("List")
            for item in found.get("items", []):
                item.setdefault("apiVersion", found.get("apiVersion"))
                item.setdefault("kind", item_kind)
        return found
