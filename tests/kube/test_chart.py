"""The Helm chart: lint, one test per knob on the rendered manifests, and an install into
the real control plane (every object accepted by a real kube-apiserver)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.kube_cluster import KubeCluster, cluster_sh
from tests.support.realenv import REPO

pytestmark = pytest.mark.kube
CHART = Path(REPO) / "charts" / "nodeledger"
WRITABLE = (["pods/binding"], ["genericnodes"], ["genericnodes/status"])


@pytest.fixture(scope="module")
def helm(kube_cluster: KubeCluster) -> str:
    env = dict(re.findall(r"^export (\w+)=(.*)$", cluster_sh("env"), re.MULTILINE))
    return env["HELM"]


def run(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {result.stderr}")
    return result


def render(helm: str, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "nl", str(CHART), "--namespace", "ops", "--kube-version", "v1.34.4"]
    for value in sets:
        args += ["--set", value]
    return [d for d in yaml.safe_load_all(run(helm, *args).stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_lint_is_clean(helm: str) -> None:
    run(helm, "lint", "--strict", str(CHART))


def test_defaults_run_the_controllers_with_the_token_as_a_file(helm: str) -> None:
    deployment = find(render(helm), "Deployment", "nl-nodeledger")
    env = env_of(deployment)
    assert env["NODELEDGER_KUBE_ENABLED"] == "true"
    assert env["NODELEDGER_DATABASE_URL"] == "sqlite:////data/nodeledger.db"
    assert env["NODELEDGER_SLURM_TOKEN_FILE"] == "/var/run/secrets/slurm/token"
    assert env["NODELEDGER_KUBE_LEASE_NAMESPACE"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["slurm-token"]["secret"]["secretName"] == "slurm-jwt"


def test_more_replicas_need_a_shared_database(helm: str) -> None:
    args = ["template", "nl", str(CHART), "--kube-version", "v1.34.4", "--set", "replicaCount=2"]
    failed = run(helm, *args, check=False)
    assert failed.returncode != 0
    assert "needs a shared database" in failed.stderr
    docs = render(helm, "replicaCount=2", "database.url=postgresql://nl@db/nl")
    assert find(docs, "Deployment", "nl-nodeledger")["spec"]["replicas"] == 2


def test_database_url_from_a_secret(helm: str) -> None:
    env = env_of(find(render(helm, "database.existingSecret=db"), "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_DATABASE_URL"] == {"secretKeyRef": {"name": "db", "key": "url"}}


def test_slurm_can_be_turned_off(helm: str) -> None:
    deployment = find(render(helm, "slurm.enabled=false"), "Deployment", "nl-nodeledger")
    env = env_of(deployment)
    assert env["NODELEDGER_SLURM_ENABLED"] == "false"
    assert "NODELEDGER_SLURM_URL" not in env
    assert "slurm-token" not in json.dumps(deployment["spec"]["template"]["spec"]["volumes"])


def test_scheduler_calls_the_extender_and_rolls_on_config_change(helm: str) -> None:
    docs = render(helm)
    config = yaml.safe_load(
        find(docs, "ConfigMap", "nl-nodeledger-scheduler")["data"]["config.yaml"]
    )
    extender = config["extenders"][0]
    assert extender["urlPrefix"] == "http://nl-nodeledger.ops.svc:8080/v1/extender"
    assert (extender["filterVerb"], extender["bindVerb"]) == ("filter", "bind")
    assert config["profiles"][0]["schedulerName"] == "nodeledger"

    def checksum(docs: list[dict[str, Any]]) -> str:
        pod = find(docs, "Deployment", "nl-nodeledger-scheduler")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    assert checksum(docs) != checksum(render(helm, "scheduler.schedulerName=other"))
    assert not [
        d for d in render(helm, "scheduler.enabled=false") if "scheduler" in d["metadata"]["name"]
    ]


def test_rbac_is_least_privilege(helm: str) -> None:
    docs = render(helm)
    role = find(docs, "ClusterRole", "nl-nodeledger")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"]
        writes = {"create", "update", "patch", "delete"} & set(rule["verbs"])
        # Writes only to what nodeledger owns, and pod bindings for the extender.
        assert not writes or rule["resources"] in WRITABLE
    assert find(docs, "Role", "nl-nodeledger-leader")["rules"][0]["resources"] == ["leases"]


@pytest.mark.parametrize(
    "value", ["slurm.failOpen=yes", "slurm.kubeMaxCpuFraction=2", "logLevel=loud", "unknown=1"]
)
def test_schema_rejects_bad_values(helm: str, value: str) -> None:
    args = ["template", "nl", str(CHART), "--kube-version", "v1.34.4", "--set", value]
    assert run(helm, *args, check=False).returncode != 0


def test_installs_into_a_real_control_plane(helm: str, kube_cluster: KubeCluster) -> None:
    env = {**os.environ, "KUBECONFIG": str(kube_cluster.kubeconfig)}
    namespace = "nodeledger-chart"
    args = [helm, "upgrade", "--install", "nl", str(CHART), "--namespace", namespace,
            "--create-namespace", "--set", "replicaCount=2",
            "--set", "database.url=postgresql://nl@db/nl"]  # fmt: skip
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    try:
        deployment = kube_cluster.kubectl_json(
            "get", "deployment", "nl-nodeledger", "-n", namespace
        )
        assert deployment["spec"]["replicas"] == 2
        assert kube_cluster.get("crd", "genericnodes.nodeledger.io") is not None
        assert "kubectl get genericnode" in result.stdout  # NOTES.txt
    finally:
        subprocess.run([helm, "uninstall", "nl", "--namespace", namespace], env=env,
                       capture_output=True, timeout=120, check=False)  # fmt: skip
