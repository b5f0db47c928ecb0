"""The real Kubernetes control plane (testenv/kube/cluster.sh) as seen by tests.

etcd, kube-apiserver and the real kube-scheduler, no kubelet and no controller manager:
nodes are plain v1 Node objects created through the API, pods bound to them stay in phase
Pending until a test patches their status, and nothing garbage-collects or finalizes.
One control plane per supported Kubernetes minor (KUBE_VERSIONS), side by side.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.kube_http import KubeHttp, resource
from tests.support.realenv import REPO, newest, run_script, wait_until

SCRIPT = Path(REPO) / "testenv" / "kube" / "cluster.sh"

__all__ = [
    "KUBE_NEWEST",
    "KUBE_VERSIONS",
    "SCRIPT",
    "KubeCluster",
    "cluster_sh",
    "kube_env",
    "pinned_version",
    "wait_until",
]

# The supported minors, each pinned by testenv/kube/tools/kube-MINOR/go.mod; cluster.sh's
# default (no NODELEDGER_KUBE_VERSION) is the newest.
SUPPORTED = ("1.37", "1.36", "1.35")
# The minors `make test` runs a control plane of; NODELEDGER_TEST_KUBE_VERSIONS narrows them
# for a quick local run. Tests marked kube_api run on each, every other test on the newest
# of them (kube_fixtures).
KUBE_VERSIONS = tuple(
    v for v in os.environ.get("NODELEDGER_TEST_KUBE_VERSIONS", ",".join(SUPPORTED)).split(",") if v
)
KUBE_NEWEST = newest(KUBE_VERSIONS or SUPPORTED[:1])


def kube_env(minor: str) -> dict[str, str]:
    """cluster.sh's environment for the control plane of Kubernetes ``minor`` (e.g. 1.36)."""
    return {"NODELEDGER_KUBE_VERSION": minor}


def pinned_version(minor: str = SUPPORTED[0]) -> str:
    """The release cluster.sh builds for ``minor``, e.g. v1.37.2 (its go.mod)."""
    go_mod = SCRIPT.parent / "tools" / f"kube-{minor}" / "go.mod"
    match = re.search(r"^require k8s.io/kubernetes (v\S+)$", go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"no k8s.io/kubernetes requirement in {go_mod}")
    return match.group(1)


def cluster_sh(
    *args: str, timeout: float = 300, check: bool = True, env: Mapping[str, str] | None = None
) -> str:
    """``env``: more for the script (another cluster: its run directory, ports, nodes)."""
    return run_script(SCRIPT, *args, timeout=timeout, check=check, env=dict(env or {}))


@dataclass(frozen=True)
class KubeCluster:
    kubeconfig: Path
    bin_dir: Path
    run_dir: Path
    kubectl_bin: str = "kubectl"
    # cluster.sh's environment beyond the defaults (the cluster with nodes: tests/deploy).
    script_env: Mapping[str, str] = field(default_factory=dict)
    # The plumbing's requests (get, list, create, status, delete) for the kinds kube_http
    # knows: in process, kubectl's start-up cost saved on each.
    http: KubeHttp = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        http = KubeHttp(self.kubeconfig)
        object.__setattr__(self, "http", http)  # frozen: set once, here
        atexit.register(http.close)

    @classmethod
    def from_env(cls, script_env: Mapping[str, str] | None = None) -> KubeCluster:
        exports = cluster_sh("env", env=script_env)
        env = dict(re.findall(r"^export (\w+)=(.*)$", exports, re.MULTILINE))
        return cls(
            Path(env["KUBECONFIG"]),
            Path(env["NODELEDGER_KUBE_BIN"]),
            Path(env["NODELEDGER_KUBE_RUN"]),
            env["KUBECTL"],
            dict(script_env or {}),
        )

    def script(self, *args: str, timeout: float = 300) -> str:
        return cluster_sh(*args, timeout=timeout, env=self.script_env)

    @property
    def scheduler_kubeconfig(self) -> Path:
        """For clientConnection.kubeconfig of an extra scheduler's configuration."""
        return self.run_dir / "scheduler.kubeconfig"

    @property
    def version(self) -> str:
        """The pinned Kubernetes version the binaries were built from, e.g. v1.37.2."""
        match = re.match(r"kube-(v[0-9.]+)-etcd-", self.bin_dir.name)
        if match is None:
            raise ValueError(f"no version in {self.bin_dir}")
        return match.group(1)

    def env(self) -> dict[str, str]:
        """The process environment with KUBECONFIG pointing at this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    # ------------------------------------------------------------------ kubectl

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> str:
        result = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, manifest: str) -> str:
        """``kubectl apply`` a YAML (or JSON) manifest, several documents allowed."""
        return self.kubectl("apply", "-f", "-", input=manifest)

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        found = resource(obj["kind"], obj["apiVersion"])
        if found is None:
            created: dict[str, Any] = json.loads(
                self.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(obj))
            )
            return created
        path = found.path(obj["metadata"].get("namespace"))
        result = self.http.request("POST", path, body=obj)
        assert result is not None
        return result

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        found = resource(kind)
        if found is not None:
            return self.http.request("GET", found.path(namespace, name), missing_ok=True)
        ns = ["--namespace", namespace] if namespace else []
        out = self.kubectl("get", kind, name, *ns, "-o", "json", "--ignore-not-found")
        if not out.strip():
            return None
        obj: dict[str, Any] = json.loads(out)
        return obj

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        labels: str | None = None,
        fields: str | None = None,
    ) -> dict[str, Any]:
        """``kubectl get KIND -o json``: the list (its ``items``) of the kind's objects in
        ``namespace`` (default: default) matching the label and field selectors."""
        found = resource(kind)
        if found is None:
            ns = ["--namespace", namespace] if namespace else []
            selectors = [
                *(["-l", labels] if labels else []),
                *(["--field-selector", fields] if fields else []),
            ]
            listed: dict[str, Any] = self.kubectl_json("get", kind, *ns, *selectors)
            return listed
        params = {"labelSelector": labels or "", "fieldSelector": fields or ""}
        result = self.http.request("GET", found.path(namespace), params=params)
        assert result is not None
        return result

    def patch(
        self, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> None:
        """A merge patch (``kubectl patch --type=merge``)."""
        self._merge_patch(kind, name, patch, namespace, subresource="")

    def patch_status(
        self, kind: str, name: str, status: Mapping[str, Any], namespace: str | None = None
    ) -> None:
        """A merge patch of ``status`` through the status subresource."""
        self._merge_patch(kind, name, {"status": status}, namespace, subresource="status")

    def _merge_patch(
        self,
        kind: str,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None,
        subresource: str,
    ) -> None:
        found = resource(kind)
        if found is None:
            ns = ["--namespace", namespace] if namespace else []
            sub = [f"--subresource={subresource}"] if subresource else []
            self.kubectl("patch", kind, name, *ns, *sub, "--type=merge", "-p", json.dumps(patch))
            return
        path = found.path(namespace, name) + (f"/{subresource}" if subresource else "")
        self.http.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def delete(
        self,
        kind: str,
        name: str | None = None,
        namespace: str | None = None,
        labels: str | None = None,
        force: bool = False,
    ) -> None:
        """``kubectl delete --ignore-not-found --wait=false`` of one object (``name``) or
        of all those matching ``labels`` (all of them when None); ``force``: at once
        (--grace-period=0 --force), as nothing would confirm a graceful deletion."""
        found = resource(kind)
        if found is None:
            ns = ["--namespace", namespace] if namespace else []
            which = [name] if name else (["-l", labels] if labels else ["--all"])
            grace = ["--grace-period=0", "--force"] if force else []
            self.kubectl("delete", kind, *which, *ns, "--ignore-not-found", "--wait=false", *grace)
            return
        body = {"gracePeriodSeconds": 0} if force else None
        params = {} if name or not labels else {"labelSelector": labels}
        self.http.request(
            "DELETE", found.path(namespace, name), params=params, body=body, missing_ok=True
        )

    # ------------------------------------------------------------------ nodes

    def create_node(
        self,
        name: str,
        cpu: str | int = 4,
        memory: str = "8Gi",
        labels: Mapping[str, str] | None = None,
        extended: Mapping[str, str | int] | None = None,
        pods: int = 110,
    ) -> dict[str, Any]:
        """A schedulable v1 Node without a kubelet: capacity = allocatable, Ready.

        Node status is only writable through the status subresource, and the
        TaintNodesByCondition admission plugin gives every new node the
        ``node.kubernetes.io/not-ready:NoSchedule`` taint that the (absent) node lifecycle
        controller would lift: both are done here.
        """
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                },
            }
        )
        resources = {"cpu": str(cpu), "memory": memory, "pods": str(pods)}
        resources.update({k: str(v) for k, v in (extended or {}).items()})
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.patch_status(
            "node",
            name,
            {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "no kubelet: a test node",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            },
        )
        self.patch("node", name, {"spec": {"taints": None}})
        node = self.get("node", name)
        assert node is not None
        return node

    def delete_node(self, name: str) -> None:
        self.delete("node", name)

    # ------------------------------------------------------------------ pods

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.get("pod", name, namespace)

    def pod_node(self, name: str, namespace: str = "default") -> str | None:
        """The node the scheduler bound the pod to, None while unbound or gone."""
        pod = self.pod(name, namespace)
        node: str | None = pod["spec"].get("nodeName") if pod else None
        return node

    def wait_bound(self, name: str, namespace: str = "default", timeout: float = 10) -> str:
        """The node the scheduler binds the pod to within ``timeout`` seconds."""
        node = wait_until(
            lambda: self.pod_node(name, namespace), timeout, 0.1, f"pod {namespace}/{name} bound"
        )
        assert node is not None
        return node

    def set_pod_phase(self, name: str, phase: str, namespace: str = "default") -> None:
        """What a kubelet would report, e.g. Succeeded when the pod's work is done."""
        self.patch_status("pod", name, {"phase": phase}, namespace)

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Gone at once: no kubelet would ever confirm a graceful deletion."""
        self.delete("pod", name, namespace, force=True)

    # ------------------------------------------------------------------ schedulers

    def start_scheduler(self, name: str, config_file: Path, port: int) -> None:
        """One more kube-scheduler from a KubeSchedulerConfiguration whose
        clientConnection.kubeconfig is :attr:`scheduler_kubeconfig`."""
        self.script("scheduler", name, str(config_file), str(port), timeout=120)

    def stop_scheduler(self, name: str) -> None:
        self.script("stop-scheduler", name, timeout=60)

    def restart_apiserver(self) -> None:
        """kube-apiserver stops and starts again on the same etcd: every watch breaks."""
        self.script("restart-apiserver", timeout=180)
