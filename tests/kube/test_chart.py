"""The Helm chart: lint, one test per knob on the rendered manifests, and an install into
the real control plane (every object accepted by a real kube-apiserver)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.core.caps import KubeCaps
from app.core.resources import Resources
from app.slurm.settings import SlurmSettings
from tests.support.helm import CHART, Helm, run
from tests.support.kube_cluster import KubeCluster

# The render and the install on every supported release (--kube-version: the cluster's).
pytestmark = [pytest.mark.kube, pytest.mark.kube_api]
# Nodes: patch only, for Slurm's taint of the service's own key (app.core.maintenance);
# events: create only (why a pod's resize is not admitted).
WRITABLE = (["pods/binding"], ["events"], ["genericnodes"], ["genericnodes/status"], ["nodes"])


def render(helm: Helm, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "nl", str(CHART), "--namespace", "ops", "--kube-version", helm.kube_version]
    for value in sets:
        args += ["--set", value]
    return [d for d in yaml.safe_load_all(run(helm, *args).stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_lint_is_clean(helm: Helm) -> None:
    run(helm, "lint", "--strict", str(CHART))


def test_defaults_run_the_controllers_with_the_token_as_a_file(helm: Helm) -> None:
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


def test_the_service_selects_only_the_servers_pods(helm: Helm) -> None:
    """The scheduler's pods carry the same name and instance labels: the Service must not
    pick them as endpoints."""
    docs = render(helm)
    selector = find(docs, "Service", "nl-nodeledger")["spec"]["selector"]
    server = find(docs, "Deployment", "nl-nodeledger")["spec"]["template"]["metadata"]["labels"]
    scheduler = find(docs, "Deployment", "nl-nodeledger-scheduler")
    scheduler_labels = scheduler["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= server.items()
    assert not selector.items() <= scheduler_labels.items()


def test_more_replicas_need_a_shared_database(helm: Helm) -> None:
    args = ["template", "nl", str(CHART), "--kube-version", helm.kube_version]
    args += ["--set", "replicaCount=2"]
    failed = run(helm, *args, check=False)
    assert failed.returncode != 0
    assert "needs a shared database" in failed.stderr
    docs = render(helm, "replicaCount=2", "database.url=postgresql://nl@db/nl")
    assert find(docs, "Deployment", "nl-nodeledger")["spec"]["replicas"] == 2


def test_more_replicas_get_a_disruption_budget_and_spread_over_nodes(helm: Helm) -> None:
    one = render(helm)
    assert [d for d in one if d["kind"] == "PodDisruptionBudget"] == []
    assert "affinity" not in find(one, "Deployment", "nl-nodeledger")["spec"]["template"]["spec"]
    shared = "database.url=postgresql://nl@db/nl"
    two = render(helm, "replicaCount=3", shared)
    budget = find(two, "PodDisruptionBudget", "nl-nodeledger")["spec"]
    assert budget["maxUnavailable"] == 1
    server = {"app.kubernetes.io/component": "server"}
    assert budget["selector"]["matchLabels"].items() >= server.items()
    spec = find(two, "Deployment", "nl-nodeledger")["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() >= server.items()
    # A site's own affinity replaces the spread; the budget takes a percentage too.
    own = render(
        helm,
        "replicaCount=3",
        shared,
        "affinity.nodeAffinity.x=1",
        "highAvailability.maxUnavailable=50%",
    )
    assert find(own, "Deployment", "nl-nodeledger")["spec"]["template"]["spec"]["affinity"] == {
        "nodeAffinity": {"x": 1}
    }
    assert find(own, "PodDisruptionBudget", "nl-nodeledger")["spec"]["maxUnavailable"] == "50%"
    off = render(helm, "replicaCount=3", shared, "highAvailability.spreadAcrossNodes=false")
    assert "affinity" not in find(off, "Deployment", "nl-nodeledger")["spec"]["template"]["spec"]


def test_database_url_from_a_secret(helm: Helm) -> None:
    env = env_of(find(render(helm, "database.existingSecret=db"), "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_DATABASE_URL"] == {"secretKeyRef": {"name": "db", "key": "url"}}


def test_the_sqlite_ledger_is_kept_on_a_claim_and_the_pod_recreated(helm: Helm) -> None:
    """Issue 30: on an emptyDir every restart lost every manual holding."""
    docs = render(helm)
    deployment = find(docs, "Deployment", "nl-nodeledger")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {
        "name": "data",
        "persistentVolumeClaim": {"claimName": "nl-nodeledger"},
    }
    claim = find(docs, "PersistentVolumeClaim", "nl-nodeledger")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"] == {"requests": {"storage": "1Gi"}}
    assert "storageClassName" not in claim["spec"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_claims_size_and_class(helm: Helm) -> None:
    docs = render(helm, "persistence.size=5Gi", "persistence.storageClass=fast")
    claim = find(docs, "PersistentVolumeClaim", "nl-nodeledger")["spec"]
    assert claim["resources"] == {"requests": {"storage": "5Gi"}}
    assert claim["storageClassName"] == "fast"


def test_an_existing_claim_is_mounted_and_none_created(helm: Helm) -> None:
    docs = render(helm, "persistence.existingClaim=ledger")
    assert [d for d in docs if d["kind"] == "PersistentVolumeClaim"] == []
    volumes = volumes_of(docs, "nl-nodeledger")
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "ledger"}


def test_persistence_off_puts_the_ledger_on_an_emptydir(helm: Helm) -> None:
    docs = render(helm, "persistence.enabled=false")
    assert [d for d in docs if d["kind"] == "PersistentVolumeClaim"] == []
    assert volumes_of(docs, "nl-nodeledger")["data"] == {"name": "data", "emptyDir": {}}
    # Still one process on the file at a time.
    assert find(docs, "Deployment", "nl-nodeledger")["spec"]["strategy"]["type"] == "Recreate"


def test_postgresql_needs_no_claim_and_rolls_replicas(helm: Helm) -> None:
    docs = render(helm, "replicaCount=2", "database.url=postgresql://nl@db/nl")
    assert [d for d in docs if d["kind"] == "PersistentVolumeClaim"] == []
    assert "strategy" not in find(docs, "Deployment", "nl-nodeledger")["spec"]
    assert volumes_of(docs, "nl-nodeledger")["data"] == {"name": "data", "emptyDir": {}}


def test_slurm_can_be_turned_off(helm: Helm) -> None:
    deployment = find(render(helm, "slurm.enabled=false"), "Deployment", "nl-nodeledger")
    env = env_of(deployment)
    assert env["NODELEDGER_SLURM_ENABLED"] == "false"
    assert "NODELEDGER_SLURM_URL" not in env
    assert "slurm-token" not in json.dumps(deployment["spec"]["template"]["spec"]["volumes"])


def test_the_headroom_is_off_by_default_and_every_knob_reaches_the_service(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(find(render(helm), "Deployment", "nl-nodeledger"))
    assert {k: v for k, v in env.items() if "HEADROOM" in k} == {
        "NODELEDGER_SLURM_HEADROOM_CPU": "0",
        "NODELEDGER_SLURM_HEADROOM_MEMORY": "0",
        "NODELEDGER_SLURM_HEADROOM_GPUS": "0",
        "NODELEDGER_SLURM_HEADROOM_LOW_WATER": "0.5",
        "NODELEDGER_SLURM_HEADROOM_GROW_STEP": "1",
        "NODELEDGER_SLURM_HEADROOM_MAX_FACTOR": "4",
        "NODELEDGER_SLURM_HEADROOM_IDLE_SECONDS": "300",
    }
    values = {"cpu": "1500m", "memory": "4Gi", "gpus": 2, "lowWater": 0.25, "growStep": 2,
              "maxFactor": 8, "idleSeconds": 60}  # fmt: skip
    args = ["template", "nl", str(CHART), "--kube-version", helm.kube_version]
    rendered = run(helm, *args, "--set-json", f"slurm.headroom={json.dumps(values)}").stdout
    env = env_of(
        find([d for d in yaml.safe_load_all(rendered) if d], "Deployment", "nl-nodeledger")
    )
    # What the service reads from the variables is the headroom the values say.
    for name, value in env.items():
        if "HEADROOM" in name:
            monkeypatch.setenv(name, value)
    policy = SlurmSettings().headroom_policy(KubeCaps())
    assert policy.amount == Resources(1500, 4 * 2**30, 2)
    assert (policy.low_water, policy.grow_step, policy.max_factor, policy.idle_seconds) == (
        0.25, 2, 8, 60
    )  # fmt: skip
    # A whole number of CPUs on the command line (an integer to Helm) is a quantity too.
    env = env_of(find(render(helm, "slurm.headroom.cpu=2"), "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_SLURM_HEADROOM_CPU"] == "2"
    # Slurm off: no headroom either.
    off = env_of(find(render(helm, "slurm.enabled=false"), "Deployment", "nl-nodeledger"))
    assert not [k for k in off if "HEADROOM" in k]


def test_scheduler_calls_the_extender_and_rolls_on_config_change(helm: Helm) -> None:
    docs = render(helm)
    config = yaml.safe_load(
        find(docs, "ConfigMap", "nl-nodeledger-scheduler")["data"]["config.yaml"]
    )
    # Placeholder pods (the default): the scheduler filters itself and the extender binds,
    # and filters only the pods that ask for GPUs by count.
    binds, gpus = config["extenders"]
    assert binds["urlPrefix"] == "https://nl-nodeledger.ops.svc:8080/v1/extender"
    assert binds["bindVerb"] == "bind"
    assert "filterVerb" not in binds
    assert "prioritizeVerb" not in binds
    assert gpus["urlPrefix"] == binds["urlPrefix"]
    assert gpus["filterVerb"] == "filter"
    assert "bindVerb" not in gpus
    assert gpus["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    assert gpus["tlsConfig"] == binds["tlsConfig"]
    assert config["profiles"][0]["schedulerName"] == "nodeledger"
    env = env_of(find(docs, "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_KUBE_PLACEHOLDERS"] == "true"
    assert env["NODELEDGER_KUBE_PLACEHOLDER_PRIORITY_CLASS"] == "nl-nodeledger-placeholder"
    priority = find(docs, "PriorityClass", "nl-nodeledger-placeholder")
    assert priority["value"] < 2_000_000_000  # not critical: a kubelet evicts nothing for it
    assert priority["preemptionPolicy"] == "Never"
    # Without them, the extender does all three for every pod.
    off = render(helm, "kube.placeholders.enabled=false")
    [extender] = yaml.safe_load(
        find(off, "ConfigMap", "nl-nodeledger-scheduler")["data"]["config.yaml"]
    )["extenders"]
    verbs = (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"])
    assert verbs == ("filter", "prioritize", "bind")
    assert env_of(find(off, "Deployment", "nl-nodeledger"))["NODELEDGER_KUBE_PLACEHOLDERS"] == (
        "false"
    )
    assert not [d for d in off if d["kind"] == "PriorityClass"]

    def checksum(docs: list[dict[str, Any]]) -> str:
        pod = find(docs, "Deployment", "nl-nodeledger-scheduler")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    assert checksum(docs) != checksum(render(helm, "scheduler.schedulerName=other"))
    assert not [
        d for d in render(helm, "scheduler.enabled=false") if "scheduler" in d["metadata"]["name"]
    ]


def scheduler_config_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(
        find(docs, "ConfigMap", "nl-nodeledger-scheduler")["data"]["config.yaml"]
    )
    return config


def test_with_placeholders_the_scheduler_keeps_to_the_managed_nodes(helm: Helm) -> None:
    """Without the extender's filter, the managed Nodes' selector becomes the profile's added
    node affinity: a pod is never placed where the ledger has no node to admit it on, nor
    on a Node whose placeholder pod the API server keeps refusing (labelled by the service)."""

    def expressions(*sets: str) -> Any:
        profile = scheduler_config_of(render(helm, *sets))["profiles"][0]
        if "pluginConfig" not in profile:
            return None
        [affinity] = profile["pluginConfig"]
        assert affinity["name"] == "NodeAffinity"
        required = affinity["args"]["addedAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        [term] = required["nodeSelectorTerms"]
        return term["matchExpressions"]

    refused = {"key": "nodeledger.io/placeholder-refused", "operator": "DoesNotExist"}
    assert expressions() == [
        {"key": "nodeledger.io/managed", "operator": "In", "values": ["true"]},
        refused,
    ]
    assert expressions("kube.nodeSelector=a=b\\,c!=d\\, e \\,!f\\,g==h") == [
        {"key": "a", "operator": "In", "values": ["b"]},
        {"key": "c", "operator": "NotIn", "values": ["d"]},
        {"key": "e", "operator": "Exists"},
        {"key": "f", "operator": "DoesNotExist"},
        {"key": "g", "operator": "In", "values": ["h"]},
        refused,
    ]
    assert expressions("kube.nodeSelector=") == [refused]  # every Node is managed
    assert expressions("kube.placeholders.enabled=false") is None  # the extender filters
    assert "only key=value" in fails(helm, "kube.nodeSelector=tier in (hpc)")
    old = ["template", "nl", str(CHART), "--namespace", "ops", "--kube-version", "1.32.0"]
    assert "needs Kubernetes 1.33" in run(helm, *old, check=False).stderr


def test_rbac_is_least_privilege(helm: Helm) -> None:
    docs = render(helm)
    role = find(docs, "ClusterRole", "nl-nodeledger")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"]
        writes = {"create", "update", "patch", "delete"} & set(rule["verbs"])
        # Writes only to what nodeledger owns, and pod bindings for the extender.
        assert not writes or rule["resources"] in WRITABLE
        assert rule["resources"] != ["nodes"] or writes <= {"patch"}
        assert rule["resources"] != ["events"] or rule["verbs"] == ["create"]
    leases, pods, resize = find(docs, "Role", "nl-nodeledger-leader")["rules"]
    assert leases["resources"] == ["leases"]
    # The placeholder pods, in the release namespace only (a Role): made, resized, deleted.
    assert (pods["resources"], pods["verbs"]) == (["pods"], ["create", "delete"])
    assert (resize["resources"], resize["verbs"]) == (["pods/resize"], ["patch"])
    # Off: only the deletes of those left from when they were on.
    off = find(render(helm, "kube.placeholders.enabled=false"), "Role", "nl-nodeledger-leader")
    assert [(r["resources"], r["verbs"]) for r in off["rules"][1:]] == [(["pods"], ["delete"])]


def test_the_service_may_write_only_placeholder_pods(helm: Helm) -> None:
    """The admission policy binds the service's own ServiceAccount, on pod creates, resizes
    and deletes, to the placeholders' shape with the configured image
    (tests/kube/test_placeholder_policy.py runs it on the API server)."""
    docs = render(helm, "kube.placeholders.image=example.com/pause:1")
    policy = find(docs, "ValidatingAdmissionPolicy", "nl-nodeledger-placeholders")["spec"]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "nl-nodeledger-placeholders")
    assert binding["spec"] == {"policyName": "nl-nodeledger-placeholders",
                               "validationActions": ["Deny"]}  # fmt: skip
    [rule] = policy["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods", "pods/resize"]  # not pods/binding: the extender binds
    assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    [condition] = policy["matchConditions"]
    assert condition["expression"] == (
        'request.userInfo.username == "system:serviceaccount:ops:nl-nodeledger"'
    )
    checks = " ".join(v["expression"] for v in policy["validations"])
    assert '"example.com/pause:1"' in checks
    assert '"nl-nodeledger-placeholder"' in checks  # the PriorityClass
    # ValidatingAdmissionPolicy v1 is served from 1.30 on: the chart needs it.
    old = ["template", "nl", str(CHART), "--kube-version", "1.29.0",
           "--set", "kube.placeholders.enabled=false"]  # fmt: skip
    assert "incompatible with Kubernetes v1.29.0" in run(helm, *old, check=False).stderr
    off = render(helm, "kube.placeholders.enabled=false")  # deletes only: still bound
    assert "priorityClassName" not in json.dumps(
        find(off, "ValidatingAdmissionPolicy", "nl-nodeledger-placeholders")
    )


@pytest.mark.parametrize(
    "value",
    [
        "slurm.failOpen=yes",
        "slurm.kubeMaxCpuFraction=2",
        "slurm.fullSyncInterval=0",
        "kube.listPageSize=0",
        "logLevel=loud",
        "logLibraryLevel=chatty",
        "requestLimits.maxBodyBytes=10",
        "requestLimits.timeoutSeconds=0",
        "slurm.pluginCheck=maybe",
        "slurm.headroom.cpu=-1",
        "slurm.headroom.cpu=two",
        "slurm.headroom.memory=4GB",
        "slurm.headroom.gpus=-1",
        "slurm.headroom.gpus=1.5",
        "slurm.headroom.lowWater=2",
        "slurm.headroom.growStep=-1",
        "slurm.headroom.maxFactor=0",
        "slurm.headroom.idleSeconds=0",
        "slurm.headroom.size=1",
        "unknown=1",
        "highAvailability.maxUnavailable=0",
        "highAvailability.maxUnavailable=half",
        "highAvailability.spreadAcrossNodes=maybe",
        "auth.mode=ldap",
        "auth.cacheTTL=-1",
        "auth.protectReads=maybe",
        "tls.source=vault",
        "tls.generate.validityDays=0",
        "tls.certManager.issuerRef.kind=Vault",
        "kube.gpuDrivers=gpu.nvidia.com",
        "kube.gpuDrivers={Not_A_Driver}",
        "kube.gpuIndexAttribute=",
        "kube.gpuDeviceTaints=maybe",
        "kube.gpuDeviceClass=Not_A_Name",
        "persistence.enabled=maybe",
        "persistence.size=lots",
        "persistence.claim=x",
    ],
)
def test_schema_rejects_bad_values(helm: Helm, value: str) -> None:
    args = ["template", "nl", str(CHART), "--kube-version", helm.kube_version, "--set", value]
    assert run(helm, *args, check=False).returncode != 0


# ---------------------------------------------------------------- authentication and TLS


def pod_spec(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def volumes_of(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return {v["name"]: v for v in pod_spec(docs, name)["volumes"]}


def scheduler_extender(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config = find(docs, "ConfigMap", "nl-nodeledger-scheduler")["data"]["config.yaml"]
    extender: dict[str, Any] = yaml.safe_load(config)["extenders"][0]
    return extender


def fails(helm: Helm, *sets: str) -> str:
    args = ["template", "nl", str(CHART), "--namespace", "ops", "--kube-version", helm.kube_version]
    for value in sets:
        args += ["--set", value]
    result = run(helm, *args, check=False)
    assert result.returncode != 0, f"rendered with {sets}"
    return result.stderr


def test_defaults_serve_https_and_check_callers_with_the_api_server(helm: Helm) -> None:
    docs = render(helm)
    deployment = find(docs, "Deployment", "nl-nodeledger")
    env = env_of(deployment)
    assert env["NODELEDGER_AUTH_MODE"] == "kubernetes"
    assert env["NODELEDGER_AUTH_PROTECT_READS"] == "true"  # names holders, Slurm users
    assert env["NODELEDGER_AUTH_CACHE_TTL"] == "5"
    assert env["NODELEDGER_AUTH_TLS_CERT_FILE"] == "/var/run/secrets/nodeledger/tls/tls.crt"
    assert env["NODELEDGER_AUTH_TLS_KEY_FILE"] == "/var/run/secrets/nodeledger/tls/tls.key"
    assert env["NODELEDGER_AUTH_TLS_CLIENT_CA_FILE"] == "/var/run/secrets/nodeledger/tls/ca.crt"
    container = pod_spec(docs, "nl-nodeledger")["containers"][0]
    assert container["ports"] == [{"name": "https", "containerPort": 8080}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    assert volumes_of(docs, "nl-nodeledger")["tls"]["secret"]["secretName"] == "nl-nodeledger-tls"
    service = find(docs, "Service", "nl-nodeledger")
    assert service["spec"]["ports"][0]["targetPort"] == "https"
    # TokenReview and SubjectAccessReview rights, through the built-in role.
    delegator = find(docs, "ClusterRoleBinding", "nl-nodeledger-auth-delegator")
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    assert delegator["subjects"] == [
        {"kind": "ServiceAccount", "name": "nl-nodeledger", "namespace": "ops"}
    ]


def test_the_scheduler_binds_over_https_with_its_client_certificate(helm: Helm) -> None:
    docs = render(helm)
    extender = scheduler_extender(docs)
    assert extender["enableHTTPS"] is True
    client = "/var/run/secrets/nodeledger/client"
    assert extender["tlsConfig"] == {
        "insecure": False,
        "caFile": f"{client}/ca.crt",
        "certFile": f"{client}/tls.crt",
        "keyFile": f"{client}/tls.key",
    }
    spec = pod_spec(docs, "nl-nodeledger-scheduler")
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["client-tls"] == client
    volumes = volumes_of(docs, "nl-nodeledger-scheduler")
    assert volumes["client-tls"]["secret"]["secretName"] == "nl-nodeledger-scheduler-tls"
    # Its permissions in nodeledger, bound to the ServiceAccount its certificate names.
    role = find(docs, "ClusterRole", "nl-nodeledger-scheduler-extender")
    assert role["rules"] == [
        {"apiGroups": ["nodeledger.io"], "resources": ["bindings"], "verbs": ["create"]},
        {"apiGroups": ["nodeledger.io"], "resources": ["nodes"], "verbs": ["get"]},
    ]
    binding = find(docs, "ClusterRoleBinding", "nl-nodeledger-scheduler-extender")
    assert binding["roleRef"]["name"] == "nl-nodeledger-scheduler-extender"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nl-nodeledger-scheduler", "namespace": "ops"}
    ]


def openssl(*args: str, input: bytes | None = None) -> str:
    result = subprocess.run(
        ["openssl", *args], input=input, capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_generated_certificates_chain_to_one_ca_and_name_the_scheduler(
    helm: Helm, tmp_path: Path
) -> None:
    docs = render(helm)
    for secret, prefix in (
        ("nl-nodeledger-tls", "server"),
        ("nl-nodeledger-scheduler-tls", "client"),
    ):
        data = find(docs, "Secret", secret)["data"]
        assert find(docs, "Secret", secret)["type"] == "kubernetes.io/tls"
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (tmp_path / f"{prefix}-{key}").write_bytes(base64.b64decode(data[key]))
    assert (tmp_path / "server-ca.crt").read_bytes() == (tmp_path / "client-ca.crt").read_bytes()
    ca = str(tmp_path / "server-ca.crt")
    server, client = str(tmp_path / "server-tls.crt"), str(tmp_path / "client-tls.crt")
    openssl("verify", "-CAfile", ca, "-purpose", "sslserver", server)
    openssl("verify", "-CAfile", ca, "-purpose", "sslclient", client)
    names = openssl("x509", "-in", server, "-noout", "-ext", "subjectAltName")
    assert "DNS:nl-nodeledger.ops.svc" in names  # the host of the scheduler's urlPrefix
    subject = openssl("x509", "-in", client, "-noout", "-subject", "-nameopt", "RFC2253")
    assert subject.strip() == "subject=CN=system:serviceaccount:ops:nl-nodeledger-scheduler"
    # The CA's key is kept (to sign what is missing on upgrades) but mounted nowhere.
    ca_secret = find(docs, "Secret", "nl-nodeledger-ca")
    ca_pem = base64.b64decode(ca_secret["data"]["tls.crt"])
    assert ca_pem == (tmp_path / "server-ca.crt").read_bytes()
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert "nl-nodeledger-ca" not in json.dumps([d["spec"]["template"] for d in deployments])
    # Without the chart's scheduler there is no client certificate to issue.
    alone = render(helm, "scheduler.enabled=false")
    assert [d["metadata"]["name"] for d in alone if d["kind"] == "Secret"] == [
        "nl-nodeledger-ca",
        "nl-nodeledger-tls",
    ]


def test_tls_and_auth_can_be_turned_off(helm: Helm) -> None:
    docs = render(helm, "tls.enabled=false", "auth.mode=none")
    env = env_of(find(docs, "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_AUTH_MODE"] == "none"
    assert not [k for k in env if k.startswith("NODELEDGER_AUTH_") and k != "NODELEDGER_AUTH_MODE"]
    extender = scheduler_extender(docs)
    assert extender["urlPrefix"] == "http://nl-nodeledger.ops.svc:8080/v1/extender"
    assert "enableHTTPS" not in extender
    assert "tlsConfig" not in extender
    assert not [d for d in docs if d["kind"] in ("Secret", "Certificate")]
    assert "client-tls" not in volumes_of(docs, "nl-nodeledger-scheduler")
    probe = pod_spec(docs, "nl-nodeledger")["containers"][0]["readinessProbe"]["httpGet"]
    assert (probe["port"], probe["scheme"]) == ("http", "HTTP")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ClusterRoleBinding", "nl-nodeledger-auth-delegator") not in names
    assert ("ClusterRole", "nl-nodeledger-scheduler-extender") not in names


def test_auth_without_tls_is_refused_while_the_chart_runs_a_scheduler(helm: Helm) -> None:
    assert "can only authenticate its bind calls with a TLS client certificate" in fails(
        helm, "tls.enabled=false"
    )
    docs = render(helm, "tls.enabled=false", "scheduler.enabled=false")
    assert env_of(find(docs, "Deployment", "nl-nodeledger"))["NODELEDGER_AUTH_MODE"] == "kubernetes"
    # Nothing to protect reads with under mode none: no caller is ever checked.
    env = env_of(
        find(render(helm, "auth.mode=none", "tls.enabled=false"), "Deployment", "nl-nodeledger")
    )
    assert "NODELEDGER_AUTH_PROTECT_READS" not in env


def test_list_page_size_and_status_rate(helm: Helm) -> None:
    env = env_of(find(render(helm), "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_KUBE_LIST_PAGE_SIZE"] == "2000"
    docs = render(helm, "kube.listPageSize=200", "kube.statusQps=50", "kube.statusBurst=100")
    env = env_of(find(docs, "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_KUBE_LIST_PAGE_SIZE"] == "200"
    assert (env["NODELEDGER_KUBE_STATUS_QPS"], env["NODELEDGER_KUBE_STATUS_BURST"]) == ("50", "100")


def test_gpu_drivers_reach_the_service_and_only_then_may_it_read_dra_objects(
    helm: Helm,
) -> None:
    docs = render(helm)
    env = env_of(find(docs, "Deployment", "nl-nodeledger"))
    assert (env["NODELEDGER_KUBE_GPU_DRIVERS"], env["NODELEDGER_KUBE_GPU_INDEX_ATTRIBUTE"]) == (
        "",
        "index",
    )
    groups = {
        g for r in find(docs, "ClusterRole", "nl-nodeledger")["rules"] for g in r["apiGroups"]
    }
    assert "resource.k8s.io" not in groups
    docs = render(
        helm, "kube.gpuDrivers={gpu.nvidia.com,gpu.example.com}", "kube.gpuIndexAttribute=minor"
    )
    env = env_of(find(docs, "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_KUBE_GPU_DRIVERS"] == "gpu.nvidia.com,gpu.example.com"
    assert env["NODELEDGER_KUBE_GPU_INDEX_ATTRIBUTE"] == "minor"
    dra = [
        (r["resources"], r["verbs"])
        for r in find(docs, "ClusterRole", "nl-nodeledger")["rules"]
        if r["apiGroups"] == ["resource.k8s.io"]
    ]
    assert dra == [
        (["resourceclaims"], ["get"]),
        (["resourceslices"], ["list"]),
        (["deviceclasses"], ["list"]),
        (["devicetaintrules"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
    ]


def test_gpu_device_taints_reach_the_service(helm: Helm) -> None:
    env = env_of(find(render(helm), "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_KUBE_GPU_DEVICE_TAINTS"] == "true"
    docs = render(helm, "kube.gpuDrivers={gpu.nvidia.com}", "kube.gpuDeviceTaints=false")
    env = env_of(find(docs, "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_KUBE_GPU_DEVICE_TAINTS"] == "false"
    # Off, the service still deletes the rules it made: the grant stays with the drivers.
    rules = find(docs, "ClusterRole", "nl-nodeledger")["rules"]
    assert any(r["resources"] == ["devicetaintrules"] for r in rules)


def test_the_gpu_device_class_is_opt_in_and_maps_the_gpu_resource(helm: Helm) -> None:
    assert not [d for d in render(helm) if d["kind"] == "DeviceClass"]
    docs = render(
        helm, "kube.gpuDrivers={gpu.nvidia.com,gpu.example.com}", "kube.gpuDeviceClass=gpu-plain"
    )
    [found] = [d for d in docs if d["kind"] == "DeviceClass"]
    assert (found["apiVersion"], found["metadata"]["name"]) == ("resource.k8s.io/v1", "gpu-plain")
    assert found["spec"] == {
        "extendedResourceName": "nvidia.com/gpu",
        "selectors": [
            {"cel": {"expression": 'device.driver in ["gpu.nvidia.com","gpu.example.com"]'}}
        ],
    }
    selector = 'device.attributes["gpu.nvidia.com"].type == "gpu"'
    docs = render(
        helm, "kube.gpuDrivers={gpu.nvidia.com}", "kube.gpuDeviceClass=gpu-plain",
        "kube.gpuResource=example.com/gpu", f"kube.gpuDeviceClassSelector={selector}",
    )  # fmt: skip
    [found] = [d for d in docs if d["kind"] == "DeviceClass"]
    assert found["spec"]["extendedResourceName"] == "example.com/gpu"
    assert found["spec"]["selectors"] == [{"cel": {"expression": selector}}]
    args = ["template", "nl", str(CHART), "--kube-version", helm.kube_version]
    refused = run(helm, *args, "--set", "kube.gpuDeviceClass=gpu-plain", check=False)
    assert "kube.gpuDeviceClass needs kube.gpuDrivers" in refused.stderr


def test_full_sync_interval_only_when_set(helm: Helm) -> None:
    env = env_of(find(render(helm), "Deployment", "nl-nodeledger"))
    assert "NODELEDGER_SLURM_FULL_SYNC_INTERVAL" not in env
    env = env_of(find(render(helm, "slurm.fullSyncInterval=300"), "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_SLURM_FULL_SYNC_INTERVAL"] == "300"


def test_request_limits_library_logs_and_the_plugin_check(helm: Helm) -> None:
    env = env_of(find(render(helm), "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_MAX_BODY_BYTES"] == "1048576"
    assert env["NODELEDGER_REQUEST_TIMEOUT_SECONDS"] == "10"
    assert env["NODELEDGER_LOG_LIBRARY_LEVEL"] == "warning"
    assert env["NODELEDGER_SLURM_PLUGIN_CHECK"] == "enforce"
    docs = render(
        helm,
        "requestLimits.maxBodyBytes=4194304",
        "requestLimits.timeoutSeconds=30",
        "logLibraryLevel=debug",
        "slurm.pluginCheck=warn",
    )
    env = env_of(find(docs, "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_MAX_BODY_BYTES"] == "4194304"
    assert env["NODELEDGER_REQUEST_TIMEOUT_SECONDS"] == "30"
    assert env["NODELEDGER_LOG_LIBRARY_LEVEL"] == "debug"
    assert env["NODELEDGER_SLURM_PLUGIN_CHECK"] == "warn"


def test_the_scheduler_may_elect_itself_on_its_own_lease(helm: Helm) -> None:
    """system:kube-scheduler grants only the Lease named kube-scheduler: a real scheduler
    pod never got past leader election without this Role."""
    docs = render(helm)
    role = find(docs, "Role", "nl-nodeledger-scheduler-leader-election")
    assert role["rules"][1] == {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["nl-nodeledger-scheduler"],
        "verbs": ["get", "update"],
    }
    binding = find(docs, "RoleBinding", "nl-nodeledger-scheduler-leader-election")
    assert binding["subjects"][0]["name"] == "nl-nodeledger-scheduler"


def test_reads_are_protected_by_default_and_the_cache_ttl(helm: Helm) -> None:
    # A node's read names its holders and Slurm's jobs and users (docs/security.md).
    env = env_of(find(render(helm), "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_AUTH_PROTECT_READS"] == "true"
    docs = render(helm, "auth.protectReads=false", "auth.cacheTTL=2")
    env = env_of(find(docs, "Deployment", "nl-nodeledger"))
    assert env["NODELEDGER_AUTH_PROTECT_READS"] == "false"
    assert env["NODELEDGER_AUTH_CACHE_TTL"] == "2"


def test_static_mode_mounts_the_token_file(helm: Helm) -> None:
    docs = render(helm, "auth.mode=static", "auth.staticTokens.secretName=nl-tokens")
    deployment = find(docs, "Deployment", "nl-nodeledger")
    env = env_of(deployment)
    assert env["NODELEDGER_AUTH_MODE"] == "static"
    assert env["NODELEDGER_AUTH_TOKEN_FILE"] == "/var/run/secrets/nodeledger/tokens/tokens.json"
    volume = volumes_of(docs, "nl-nodeledger")["auth-tokens"]["secret"]
    assert volume == {
        "secretName": "nl-tokens",
        "items": [{"key": "tokens.json", "path": "tokens.json"}],
    }
    mounts = {
        m["name"] for m in deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert "auth-tokens" in mounts
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ClusterRoleBinding", "nl-nodeledger-auth-delegator") not in names
    assert ("ClusterRole", "nl-nodeledger-scheduler-extender") not in names
    fails(helm, "auth.mode=static")  # the schema wants the Secret's name


def test_tls_from_your_own_secrets(helm: Helm) -> None:
    docs = render(
        helm, "tls.source=secrets", "tls.serverSecret=srv", "tls.schedulerClientSecret=cli"
    )
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert volumes_of(docs, "nl-nodeledger")["tls"]["secret"]["secretName"] == "srv"
    client = volumes_of(docs, "nl-nodeledger-scheduler")["client-tls"]["secret"]
    assert client["secretName"] == "cli"
    fails(helm, "tls.source=secrets", "tls.serverSecret=srv")


def test_tls_from_cert_manager(helm: Helm) -> None:
    docs = render(
        helm,
        "tls.source=certManager",
        "tls.certManager.issuerRef.name=lab-ca",
        "tls.certManager.issuerRef.kind=ClusterIssuer",
    )
    assert not [d for d in docs if d["kind"] == "Secret"]
    server = find(docs, "Certificate", "nl-nodeledger-tls")["spec"]
    assert server["secretName"] == "nl-nodeledger-tls"
    assert "nl-nodeledger.ops.svc" in server["dnsNames"]
    assert server["usages"] == ["server auth"]
    issuer = {"name": "lab-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert server["issuerRef"] == issuer
    client = find(docs, "Certificate", "nl-nodeledger-scheduler-tls")["spec"]
    assert client["commonName"] == "system:serviceaccount:ops:nl-nodeledger-scheduler"
    assert client["usages"] == ["client auth"]
    assert client["issuerRef"] == issuer
    fails(helm, "tls.source=certManager")  # no issuer
    long = ["template", "a-rather-long-release-name", str(CHART),
            "--kube-version", helm.kube_version, "--namespace", "hpc-scheduling-team",
            "--set", "tls.source=certManager",
            "--set", "tls.certManager.issuerRef.name=lab-ca"]  # fmt: skip
    failed = run(helm, *long, check=False)
    assert failed.returncode != 0
    assert "longer than the 64 characters of a commonName" in failed.stderr


def test_installs_into_a_real_control_plane(helm: Helm, kube_cluster: KubeCluster) -> None:
    env = {**os.environ, "KUBECONFIG": str(kube_cluster.kubeconfig)}
    namespace = "nodeledger-chart"
    args = [helm.path, "upgrade", "--install", "nl", str(CHART), "--namespace", namespace,
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
        assert "metadata: {name: nodeledger-admit}" in result.stdout
        assert kube_cluster.get("clusterrolebinding", "nl-nodeledger-auth-delegator") is not None

        def certificates() -> dict[str, Any]:
            names = ("nl-nodeledger-ca", "nl-nodeledger-tls", "nl-nodeledger-scheduler-tls")
            return {n: (kube_cluster.get("secret", n, namespace) or {}).get("data") for n in names}

        # An upgrade keeps the generated certificates (the pods read them at start); one
        # that went missing is signed again by the same CA.
        first = certificates()
        assert all(first.values())
        again = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120,
                               check=False)  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert certificates() == first
        kube_cluster.kubectl("delete", "secret", "nl-nodeledger-scheduler-tls", "-n", namespace)
        again = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120,
                               check=False)  # fmt: skip
        assert again.returncode == 0, again.stderr
        renewed = certificates()
        assert renewed["nl-nodeledger-tls"] == first["nl-nodeledger-tls"]
        client = renewed["nl-nodeledger-scheduler-tls"]
        assert client["tls.crt"] != first["nl-nodeledger-scheduler-tls"]["tls.crt"]
        assert client["ca.crt"] == first["nl-nodeledger-tls"]["ca.crt"]
    finally:
        subprocess.run([helm.path, "uninstall", "nl", "--namespace", namespace], env=env,
                       capture_output=True, timeout=120, check=False)  # fmt: skip
