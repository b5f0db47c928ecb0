"""The product as a site runs it: the service's image, installed by Helm into a Kubernetes
cluster with real nodes (kubelet + containerd), talking to a real Slurm cluster and a
PostgreSQL server from inside its pods.

Everything here runs beside the test clusters, not in them: its own Kubernetes control plane
with nodes n1, n2 and n3 (testenv/kube/nodes.sh; n3 is the GPU node: containerd 2.x and the
DRA kubelet plugin of four fake GPUs, Slurm's n3's gpu g0..g3), its own Slurm cluster (a
copy of the test chroot) whose slurmrestd also listens on the nodes' bridge, and its own
PostgreSQL listening there too. Pods reach the host at HOST_IP. Each Node is co-managed
with the Slurm node of its name (the kubelets' nodeledger.io/slurm-node label).
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support import workers
from tests.support.kube_cluster import KubeCluster, cluster_sh, pinned_version
from tests.support.oci import SERVICE_BUILD, build
from tests.support.realenv import REPO, run_script, wait_until
from tests.support.slurm_cluster import SlurmCluster, main_cache, seed_cache

HOST_IP = "10.231.0.1"  # the nodes' bridge on the host (testenv/kube/nodes.sh)
# Beside the test clusters' run directory; only one cluster with nodes runs on a machine.
RUNDIR = str(workers.main_rundir() / "deploy")
NODES = ("n1", "n2", "n3")
GPU_NODE = "n3"  # Slurm's n3 has the GPUs (testenv/slurm/cluster.sh)
GPU_DRIVER = "gpu.nodeledger.test"  # the plugin's (testenv/kube/tools/gpu-plugin)
GPU_CLASS = "nodeledger-gpu"  # the chart's DeviceClass (kube.gpuDeviceClass)
KUBE_ENV = {
    "NODELEDGER_RUNDIR": RUNDIR,
    "NODELEDGER_KUBE_PORT_BASE": "13400",
    "NODELEDGER_KUBE_NODES": str(len(NODES)),
    "NODELEDGER_KUBE_GPU_NODE": GPU_NODE.removeprefix("n"),
}
SLURM_ENV = {
    "NODELEDGER_RUNDIR": RUNDIR,
    "NODELEDGER_SLURM_PORT_BASE": "13600",
    "NODELEDGER_SLURM_RESTD_ADDRESS": HOST_IP,
}
IMAGE = "registry.nodeledger.test/nodeledger:test"
SCHEDULER_IMAGE_REPOSITORY = "registry.nodeledger.test/kube-scheduler"
# cluster.sh tags the kube-scheduler image it builds with the pinned Kubernetes version.
KUBE_VERSION = pinned_version()  # the newest supported release: cluster.sh's default
CHART = Path(REPO) / "charts" / "nodeledger"
NAMESPACE = "nodeledger"
RELEASE = "nl"


def start_kube() -> KubeCluster:
    cluster_sh("up", timeout=1800, env=KUBE_ENV)
    return KubeCluster.from_env(KUBE_ENV)


def stop_kube() -> None:
    cluster_sh("down", timeout=300, env=KUBE_ENV)


def start_slurm(version: str) -> SlurmCluster:
    seed_cache(version, SLURM_CACHE)
    _slurm(version, "up", timeout=1800)
    return SlurmCluster.from_env(version, _slurm_env())


def stop_slurm(version: str) -> None:
    _slurm(version, "down", timeout=300)


SLURM_CACHE = main_cache() / "deploy"  # a copy of the test chroot: its own cluster


def _slurm_env() -> dict[str, str]:
    return {**SLURM_ENV, "NODELEDGER_CACHE": str(SLURM_CACHE)}


def _slurm(version: str, command: str, timeout: float) -> str:
    env = {**_slurm_env(), "NODELEDGER_SLURM_VERSION": version}
    return run_script(
        Path(REPO) / "testenv" / "slurm" / "cluster.sh", command, timeout=timeout, env=env
    )


def start_postgres() -> str:
    """The URL pods use: the server on the bridge, database ``postgres``."""
    return _pg("up").strip().replace("@127.0.0.1:", f"@{HOST_IP}:")


def stop_postgres() -> None:
    _pg("down")


def _pg(command: str) -> str:
    return run_script(
        Path(REPO) / "testenv" / "postgres" / "pg.sh",
        command,
        timeout=300,
        env={"NODELEDGER_RUNDIR": RUNDIR, "NODELEDGER_PG_LISTEN": HOST_IP},
    )


def build_image() -> Path:
    """`make image` (cached by the work tree's content): the OCI archive."""
    archive, _ = build(SERVICE_BUILD, env={"IMAGE": IMAGE})
    return archive


@dataclass(frozen=True)
class Helm:
    """helm against the deploy cluster."""

    binary: str
    kube: KubeCluster

    @classmethod
    def of(cls, kube: KubeCluster) -> Helm:
        env = dict(re.findall(r"^export (\w+)=(.*)$", cluster_sh("env", env=KUBE_ENV), re.M))
        return cls(env["HELM"], kube)

    def __call__(self, *args: str, timeout: float = 600) -> str:
        result = subprocess.run(
            [self.binary, "--kubeconfig", str(self.kube.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)}:\n{result.stderr[-3000:]}")
        return result.stdout


def values(postgres_url: str, slurm: SlurmCluster, **extra: Any) -> dict[str, Any]:
    """The chart's values for the deploy cluster: two replicas on PostgreSQL, Slurm through
    the bridge, the images built here (never pulled), the GPU node's devices co-managed
    (claim pods and plain nvidia.com/gpu pods held by device)."""
    repository, tag = IMAGE.rsplit(":", 1)
    slurm_url = slurm.url.replace("127.0.0.1", HOST_IP)
    base: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "replicaCount": 2,
        "database": {"url": postgres_url},
        "slurm": {"url": slurm_url, "userName": slurm.user, "syncInterval": 1},
        "kube": {
            "gpuDrivers": [GPU_DRIVER],
            "gpuDeviceClass": GPU_CLASS,
            # The kubelets' own sandbox image: nothing is pulled.
            "placeholders": {"enabled": True, "image": PAUSE_IMAGE},
        },
        "scheduler": {
            "image": {"repository": SCHEDULER_IMAGE_REPOSITORY, "tag": KUBE_VERSION},
        },
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}},
    }
    return _merge(base, extra)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def write_values(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def wait_rollout(kube: KubeCluster, kind_name: str, timeout: float = 300) -> float:
    """Seconds until ``kubectl rollout status`` of ``kind_name`` succeeds."""
    started = time.monotonic()
    kube.kubectl(
        "-n", NAMESPACE, "rollout", "status", kind_name, f"--timeout={int(timeout)}s",
        timeout=timeout + 30,
    )  # fmt: skip
    return time.monotonic() - started


FULLNAME = f"{RELEASE}-nodeledger"
SERVER_PODS = "app.kubernetes.io/component=server"
SCHEDULER_PODS = "app.kubernetes.io/component=scheduler"


@dataclass
class Release:
    """The chart installed in NAMESPACE, and the ledger's REST API as its pods serve it."""

    helm: Helm
    kube: KubeCluster
    slurm: SlurmCluster
    values_file: Path
    values: dict[str, Any]
    install_seconds: float
    reader_token: str = ""  # the chart protects reads by default: a reader's, for api()

    @classmethod
    def install(
        cls,
        helm: Helm,
        kube: KubeCluster,
        slurm: SlurmCluster,
        values_file: Path,
        chart_values: dict[str, Any],
    ) -> Release:
        started = time.monotonic()
        helm(
            "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file),
            "--wait", "--timeout", "8m",
        )  # fmt: skip
        release = cls(helm, kube, slurm, values_file, chart_values, time.monotonic() - started)
        kube.kubectl("apply", "-f", "-", input=READER)
        release.reader_token = kube.kubectl(
            "-n", "default", "create", "token", "nl-reader", "--duration=4h"
        ).strip()
        # A pod the extender refuses because the ledger has not discovered its node yet
        # waits for the next cluster event (or kube-scheduler's 5 minutes): tests and the
        # bench create pods once the nodes are admissible.
        wait_until(release.nodes_admissible, 120, 0.5, "every node admissible in the ledger")
        return release

    def nodes_admissible(self) -> bool:
        response = self.api("GET", "/v1/nodes")
        return response.status_code == 200 and {
            n["name"] for n in response.json() if n["admissible"]
        } >= set(NODES)

    chart: Path = CHART

    def stop_database(self) -> None:
        _pg("stop")

    def start_database(self) -> None:
        _pg("start")

    def installed(self) -> bool:
        return RELEASE in self.helm("list", "-n", NAMESPACE, "-q").split()

    def pods(self, selector: str) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self.kube.kubectl_json(
            "-n", NAMESPACE, "get", "pods", "-l", selector
        )["items"]
        return pods

    def ready_server_ips(self) -> list[str]:
        return [
            p["status"]["podIP"]
            for p in self.pods(SERVER_PODS)
            if not p["metadata"].get("deletionTimestamp") and _ready(p)
        ]

    def tls(self) -> ssl.SSLContext:
        secret = self.kube.kubectl_json("-n", NAMESPACE, "get", "secret", f"{FULLNAME}-tls")
        ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
        context = ssl.create_default_context(cadata=ca)
        # The certificate names the Service; the tests call a pod by its address.
        context.check_hostname = False
        return context

    def reader(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.reader_token}"}

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A call to one ready replica of the service, as the reader unless ``headers``
        name another caller."""
        ips = wait_until(self.ready_server_ips, 120, 0.5, "a ready replica")
        url = f"https://{ips[0]}:8080{path}"
        headers = kwargs.pop("headers", None) or self.reader()
        return httpx.request(method, url, verify=self.tls(), timeout=10, headers=headers, **kwargs)

    def replica_metric(self, name: str) -> list[float]:
        """An unlabelled metric as every replica that answers serves it, ready or not (the
        leader may run on a node whose kubelet is lost)."""
        figures = []
        for pod in self.pods(SERVER_PODS):
            ip = pod.get("status", {}).get("podIP")
            if not ip:
                continue
            try:
                url = f"https://{ip}:8080/metrics"
                text = httpx.get(url, verify=self.tls(), timeout=5, headers=self.reader()).text
            except httpx.HTTPError:
                continue
            figures += [
                float(line.split()[1]) for line in text.splitlines() if line.split(" ")[0] == name
            ]
        return figures or [0.0]

    def ledger_node(self, name: str) -> dict[str, Any]:
        response = self.api("GET", f"/v1/nodes/{name}")
        response.raise_for_status()
        node: dict[str, Any] = response.json()
        return node

    def holding_of(self, pod_uid: str, node: str) -> dict[str, Any] | None:
        """The pod's holding on ``node`` as the ledger has it, None without one."""
        for holding in self.ledger_node(node)["holdings"]:
            if holding["holder"]["kind"] == "pod" and holding["holder"]["id"] == pod_uid:
                found: dict[str, Any] = holding
                return found
        return None


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def busybox_pod(
    name: str,
    script: str,
    *,
    scheduler: str | None = "nodeledger",
    cpu: str = "100m",
    memory: str = "32Mi",
    grace: int = 30,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod running ``sh -c script`` in the busybox image built for the test nodes."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace,
        "containers": [
            {
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }
        ],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def caller(name: str, *rules: str) -> str:
    """A ServiceAccount ``name`` in namespace default with a ClusterRole of ``rules`` (one
    YAML flow mapping each), as docs/security.md grants a caller."""
    listed = "".join(f"\n  - {rule}" for rule in rules)
    return f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {name}, namespace: default}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {name}}}
rules:{listed}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: default}}]
"""


# Every read (the chart protects them by default).
READER = caller(
    "nl-reader",
    "{apiGroups: [nodeledger.io], resources: [nodes], verbs: [get, list]}",
    "{apiGroups: [nodeledger.io], resources: [holdings, events], verbs: [list]}",
)


BUSYBOX_IMAGE = "registry.nodeledger.test/busybox:1.35"
PAUSE_IMAGE = "registry.nodeledger.test/pause:3.10"

__all__ = [
    "BUSYBOX_IMAGE",
    "CHART",
    "FULLNAME",
    "GPU_CLASS",
    "GPU_DRIVER",
    "GPU_NODE",
    "HOST_IP",
    "IMAGE",
    "KUBE_VERSION",
    "NAMESPACE",
    "NODES",
    "PAUSE_IMAGE",
    "RELEASE",
    "RUNDIR",
    "SCHEDULER_PODS",
    "SERVER_PODS",
    "Helm",
    "Release",
    "build_image",
    "busybox_pod",
    "caller",
    "start_kube",
    "start_postgres",
    "start_slurm",
    "stop_kube",
    "stop_postgres",
    "stop_slurm",
    "values",
    "wait_rollout",
    "wait_until",
    "write_values",
]
