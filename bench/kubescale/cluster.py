"""A Kubernetes control plane of the bench's own (testenv/kube/cluster.sh with another
runtime directory and other ports, no kube-scheduler), so loading 150,000 pods never
touches the control plane the tests use; and an aiohttp client for it (client
certificate from the admin kubeconfig, many requests in flight)."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import ssl
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import yaml

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "testenv" / "kube" / "cluster.sh"


@dataclass(frozen=True)
class ControlPlane:
    rundir: Path  # NODELEDGER_RUNDIR of this control plane
    port_base: int

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "NODELEDGER_RUNDIR": str(self.rundir),
            "NODELEDGER_KUBE_PORT_BASE": str(self.port_base),
            "NODELEDGER_KUBE_SCHEDULER": "false",  # pods come with spec.nodeName
        }

    def _run(self, *args: str, timeout: float = 3600) -> str:
        result = subprocess.run(
            ["bash", str(SCRIPT), *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"cluster.sh {' '.join(args)}: {result.stderr[-2000:]}")
        return result.stdout

    def up(self) -> None:
        self._run("up")

    def down(self) -> None:
        self._run("down", timeout=120)

    def exports(self) -> dict[str, str]:
        return dict(re.findall(r"^export (\w+)=(.*)$", self._run("env"), re.MULTILINE))

    @property
    def kubeconfig(self) -> Path:
        return Path(self.exports()["KUBECONFIG"])

    def kubectl(self, *args: str) -> str:
        exports = self.exports()
        result = subprocess.run(
            [exports["KUBECTL"], "--kubeconfig", exports["KUBECONFIG"], *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr[-2000:]}")
        return result.stdout

    def pid(self, daemon: str) -> int | None:
        """The pid of ``etcd`` or ``kube-apiserver``."""
        try:
            return int((self.rundir / "kube" / f"{daemon}.pid").read_text().strip())
        except (OSError, ValueError):
            return None


def admin_tls(kubeconfig: Path) -> tuple[str, ssl.SSLContext]:
    """The API server's URL and a TLS context trusting its CA with the kubeconfig's admin
    client certificate (the first cluster and user of an admin kubeconfig)."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    context = ssl.create_default_context(cadata=ca)
    with tempfile.TemporaryDirectory(prefix="kube-scale-") as files:
        cert, key = Path(files, "c.crt"), Path(files, "c.key")
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        context.load_cert_chain(cert, key)
    return str(cluster["server"]), context


def admin_client(kubeconfig: Path, timeout: float = 30) -> httpx.Client:
    """A blocking client of the API server as the kubeconfig's admin (one request at a
    time: for timing single calls, where the async ``Api`` is for loading)."""
    server, context = admin_tls(kubeconfig)
    return httpx.Client(base_url=server, verify=context, timeout=timeout)


class Api:
    """Async JSON requests to the API server as the kubeconfig's admin."""

    def __init__(self, kubeconfig: Path, concurrency: int) -> None:
        self.server, self.ssl = admin_tls(kubeconfig)
        self.concurrency = concurrency
        self.session: aiohttp.ClientSession | None = None

    def run(self, work: Callable[[Api], Awaitable[T]]) -> T:
        """``work(api)`` in an event loop of its own, with a session (pool) of its own."""

        async def session() -> T:
            connector = aiohttp.TCPConnector(ssl=self.ssl, limit=self.concurrency)
            timeout = aiohttp.ClientTimeout(total=120)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
                self.session = s
                try:
                    return await work(self)
                finally:
                    self.session = None

        return asyncio.run(session())

    async def call(
        self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        assert self.session is not None
        async with self.session.request(
            method, self.server + path, json=body, params=params
        ) as response:
            data = await response.json(content_type=None) if response.content_length != 0 else {}
            return response.status, data

    async def count(self, path: str) -> int:
        """How many objects a LIST of ``path`` would return (one object read)."""
        status, body = await self.call("GET", path, params={"limit": "1"})
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {body}")
        return len(body.get("items") or []) + int(body["metadata"].get("remainingItemCount") or 0)
