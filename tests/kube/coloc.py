"""A co-location environment for end-to-end tests: the real control plane and the real
Slurm cluster, three Nodes mapped to the three Slurm nodes, `nodeledger serve` with both
integrations on, and a second kube-scheduler using the documented extender configuration."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.kube_cluster import KubeCluster
from tests.support.net import free_port
from tests.support.realenv import REPO
from tests.support.service import ServiceProcess, running_service
from tests.support.slurm_cluster import SlurmCluster, wait_until

FILES = Path(REPO) / "charts" / "nodeledger" / "files"
SCHEDULER_CONFIG = FILES / "kube-scheduler-config.yaml"
# kube.placeholders.enabled: the scheduler filters itself, the extender binds (issue 35).
PLACEHOLDER_CONFIG = FILES / "kube-scheduler-config-placeholders.yaml"
CRD = Path(REPO) / "crds" / "genericnodes.nodeledger.io.yaml"
SELECTOR = "nodeledger.io/managed"
NODES = {"kn1": "n1", "kn2": "n2", "kn3": "n3"}  # Kubernetes node -> Slurm node


@dataclass
class Coloc:
    kube: KubeCluster
    slurm: SlurmCluster
    database_url: str
    env: dict[str, str]
    port: int
    log_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tmp_dir(self) -> Path:
        """The service processes' TMPDIR."""
        return Path(self.env["TMPDIR"])

    def service(
        self, name: str = "nodeledger"
    ) -> contextlib.AbstractContextManager[ServiceProcess]:
        """`nodeledger serve` on the port the scheduler calls (restartable)."""
        return self.replica(name, self.port)

    def replica(self, name: str, port: int) -> contextlib.AbstractContextManager[ServiceProcess]:
        """A service process on the shared database; ``name`` is its leader-election
        identity (replicas on one host must not share the default, the host name)."""
        env = {**self.env, "NODELEDGER_KUBE_IDENTITY": name}
        return running_service(self.database_url, self.log_dir, env=env, name=name, port=port)

    def get(self, path: str, **params: str) -> Any:
        return httpx.get(f"{self.url}{path}", params=params, timeout=30).json()

    def ledger_node(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = self.get(f"/v1/nodes/{name}")
        return body

    def pod_holdings(self) -> dict[str, str]:
        """pod uid -> ledger node."""
        return {h["holder"]["id"]: h["node"] for h in self.get("/v1/holdings", holder_kind="pod")}

    def pod(
        self,
        name: str,
        cpu: str,
        memory: str = "1Gi",
        *,
        scheduler: str = "nodeledger",
        node: str | None = None,
        gpu: int = 0,
        owner: dict[str, Any] | None = None,
        node_selector: dict[str, str] | None = None,
    ) -> str:
        """Create a pod; returns its uid."""
        requests: dict[str, str] = {"cpu": cpu, "memory": memory}
        limits: dict[str, str] = {}
        if gpu:
            requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpu)
        container = {
            "name": "main",
            "image": "busybox",
            "resources": {"requests": requests, "limits": limits},
        }
        spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [container]}
        if node:
            spec["nodeName"] = node
        if node_selector:
            spec["nodeSelector"] = node_selector
        meta: dict[str, Any] = {"name": name, "namespace": "default"}
        if owner:
            meta["ownerReferences"] = [owner]
        created = self.kube.create(
            {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        )
        return str(created["metadata"]["uid"])

    def events_for(self, pod: str) -> str:
        listed = self.kube.list("events", "default", fields=f"involvedObject.name={pod}")
        return " ".join(e.get("message", "") for e in listed["items"])

    def gres(self, slurm_node: str) -> dict[str, int]:
        return self.slurm.k8s_counts(slurm_node)


MANAGED_AFFINITY = '- {key: nodeledger.io/managed, operator: In, values: ["true"]}'


def scheduler_config(
    path: Path,
    kube: KubeCluster,
    url: str,
    source: Path = SCHEDULER_CONFIG,
    managed: tuple[str, str] | None = None,
) -> Path:
    """The documented configuration, pointed at this control plane and service;
    ``managed``: the label (key, value) of the managed Nodes, where the placeholder
    configuration's node affinity names the chart's default."""
    text = source.read_text()
    if managed is not None:
        key, value = managed
        text = text.replace(
            MANAGED_AFFINITY, f'- {{key: {key}, operator: In, values: ["{value}"]}}'
        )
    text = text.replace("/etc/kubernetes/scheduler.conf", str(kube.scheduler_kubeconfig))
    text = text.replace("http://nodeledger.nodeledger.svc:8080", url)
    text = text.replace("leaderElect: true", "leaderElect: false")
    path.write_text(text)
    return path


@contextlib.contextmanager
def coloc_env(
    kube: KubeCluster,
    slurm: SlurmCluster,
    database_url: str,
    tmp: Path,
    *,
    placeholders: bool = False,
) -> Iterator[tuple[Coloc, ServiceProcess]]:
    """``placeholders``: the service keeps placeholder pods and the scheduler runs the
    chart's configuration for them (it binds through the extender only)."""
    kube.apply(CRD.read_text())
    for name, alias in NODES.items():
        kube.create_node(
            name,
            cpu=16,
            memory="32000Mi",
            labels={SELECTOR: "true", "nodeledger.io/slurm-node": alias},
            extended={"nvidia.com/gpu": 4} if alias == "n3" else {},
        )
    tmp_dir = tmp / "service-tmp"
    tmp_dir.mkdir()
    env = {
        "NODELEDGER_LOG_LEVEL": "info",
        "NODELEDGER_KUBE_ENABLED": "true",
        "NODELEDGER_KUBE_KUBECONFIG": str(kube.kubeconfig),
        "NODELEDGER_KUBE_NODE_SELECTOR": f"{SELECTOR}=true",
        "NODELEDGER_KUBE_CLUSTER_NAME": "lab",
        "NODELEDGER_KUBE_BINDING_GRACE": "5",
        "NODELEDGER_KUBE_PLACEHOLDERS": str(placeholders).lower(),
        "TMPDIR": str(tmp_dir),
        **slurm.service_env,
    }
    coloc = Coloc(kube, slurm, database_url, env, free_port(), tmp)
    source = PLACEHOLDER_CONFIG if placeholders else SCHEDULER_CONFIG
    config = scheduler_config(tmp / "scheduler.yaml", kube, coloc.url, source)
    try:
        with coloc.service() as service:
            wait_until(
                lambda: (
                    all(coloc.ledger_node(n).get("name") == n for n in NODES)
                    and all(coloc.ledger_node(n)["capacity"]["cpu"] == "16" for n in NODES)
                ),
                30,
                what="nodes discovered with Slurm's sizes",
            )
            kube.start_scheduler("nodeledger", config, free_port())
            yield coloc, service
    finally:
        with contextlib.suppress(Exception):
            kube.stop_scheduler("nodeledger")
        kube.delete("pods", namespace="default", force=True)
        for name in NODES:
            with contextlib.suppress(Exception):
                kube.delete_node(name)
        kube.delete("genericnodes")
