"""Placeholder pods against cluster policy, with fakes: their shape passes Pod Security
"restricted" and a LimitRange, and a create or resize the API server refuses is tried again
with a backoff, and keeps its node from the chart's scheduler (a Node label), in /readyz
and in a metric once it has lasted REFUSED_BOUND.

The tests marked kube run the same on the real API server, which enforces Pod Security
admission, LimitRanges, ResourceQuotas and ValidatingAdmissionPolicies itself (no kubelet
needed): the placeholders controller in-process over a SQLite ledger, writing through the
service's own client."""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from app.core import placeholder
from app.core.pods import pod_info
from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.kube.client import KubeClient, KubeError
from app.kube.controllers.discovery import NodeRef
from app.kube.controllers.placeholders import REFUSED_BOUND, Placeholders
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import Metrics
from tests.kube.coloc import CRD, PLACEHOLDER_CONFIG, scheduler_config
from tests.support.helm import CHART, Helm, run
from tests.support.kube_cluster import KubeCluster
from tests.support.net import free_port
from tests.support.placeholders import GIB, NODE, FakePods, one_pass
from tests.support.realenv import wait_until
from tests.support.service import running_service

FORBIDDEN = 'pods "nodeledger-held-a" is forbidden: violates PodSecurity "restricted:latest"'


def test_the_pod_passes_pod_security_restricted_and_any_limit_range() -> None:
    pod = placeholder.pod("kn1", "u", Resources(1500, GIB), namespace="nl", image="pause")
    spec = pod["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65535,
        "runAsGroup": 65535,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    [container] = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    resources = container["resources"]
    assert resources["limits"] == resources["requests"]  # nothing for a LimitRange to add
    # The shape the chart's admission policy allows: no token, volume, host namespace or
    # other ServiceAccount, one container of the image.
    assert spec["automountServiceAccountToken"] is False
    assert not {"volumes", "serviceAccountName", "hostNetwork", "hostPID", "hostIPC"} & set(spec)
    assert not {"command", "args", "env", "envFrom", "volumeMounts"} & set(container)
    assert container["image"] == "pause"


class FakeApi(FakePods):
    """FakePods, and the Nodes' refused label; ``refuse``: what every create or resize of a
    placeholder raises (None: they go through)."""

    def __init__(self) -> None:
        super().__init__()
        self.labelled: set[str] = set()
        self.refuse: KubeError | None = None

    def request(self, method: str, path: str, *, body: Any = None, **kw: Any) -> dict[str, Any]:
        if path.startswith("/api/v1/nodes/"):
            node = path.rsplit("/", 1)[-1]
            self.calls.append((method, node))
            value = body["metadata"]["labels"][placeholder.REFUSED_LABEL]
            (self.labelled.add if value == "true" else self.labelled.discard)(node)
            return {}
        if self.refuse is not None and method in ("POST", "PATCH"):
            self.calls.append((method, "refused"))
            raise self.refuse
        return super().request(method, path, body=body, **kw)

    def list(self, path: str, decode: Any, shape: Any = None, **query: Any) -> Any:
        if path == "/api/v1/nodes":
            assert query == {"labelSelector": f"{placeholder.REFUSED_LABEL}=true"}
            return [decode({"metadata": {"name": n}}) for n in sorted(self.labelled)], "1"
        return super().list(path, decode, shape, **query)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_api_controller(
    ledger: Ledger, api: FakeApi, clock: Clock, metrics: Metrics
) -> Placeholders:
    return Placeholders(
        NodeSnapshot(ledger), api, lambda n: NodeRef(NODE, f"uid-{n}"),  # type: ignore[arg-type]
        None, namespace="nl", image="pause", qps=1000, burst=1000, metrics=metrics,
        monotonic=clock,
    )  # fmt: skip


def step(placeholders: Placeholders) -> list[tuple[str, str]]:
    """One pass; its calls."""
    calls: list[tuple[str, str]] = placeholders.client.calls  # type: ignore[attr-defined]
    before = len(calls)
    one_pass(placeholders)
    return calls[before:]


@pytest.fixture
def refused(ledger: Ledger) -> tuple[Placeholders, FakeApi, Clock, Metrics]:
    ledger.upsert_node("a", NodeSpec(capacity=NODE))
    ledger.upsert_node("b", NodeSpec(capacity=NODE))
    ledger.admit("a", Holder(HolderKind.MANUAL, "m1"), Resources(4000, GIB))
    api, clock, metrics = FakeApi(), Clock(), Metrics(CollectorRegistry())
    placeholders = fake_api_controller(ledger, api, clock, metrics)
    placeholders.snapshot.subscribe(placeholders.mark)
    placeholders.resync([])
    placeholders.find_labelled()
    return placeholders, api, clock, metrics


def gauge(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("nodeledger_kube_placeholders_refused")


def test_a_refused_placeholder_keeps_its_node_from_the_scheduler_within_the_bound(
    refused: tuple[Placeholders, FakeApi, Clock, Metrics], caplog: pytest.LogCaptureFixture
) -> None:
    placeholders, api, clock, metrics = refused
    api.refuse = KubeError(f"POST pods: 403 {FORBIDDEN}", 403)
    caplog.set_level(logging.WARNING)
    assert step(placeholders) == [("POST", "refused")]  # said, not raised
    assert step(placeholders) == []  # no loop at the write rate: tried again after 1 s
    clock.now += 1
    assert step(placeholders) == [("POST", "refused")]
    clock.now += 2
    assert step(placeholders) == [("POST", "refused")]  # then after 2 s, 4 s, ...
    assert (api.labelled, placeholders.refusals, gauge(metrics)) == (set(), None, 0)
    clock.now += REFUSED_BOUND - 3  # the bound since the first refusal
    assert ("PATCH", "a") in step(placeholders)
    assert api.labelled == {"a"}  # the chart's scheduler's node affinity keeps pods off
    assert placeholders.refusals is not None
    assert "on 1 node(s)" in placeholders.refusals
    assert FORBIDDEN in placeholders.refusals
    assert gauge(metrics) == 1
    assert sum("refused, tried again" in r.message for r in caplog.records) == 1
    # The policy is lifted: the next try creates it, and the node is back.
    api.refuse = None
    clock.now += 60
    assert step(placeholders) == [("POST", "nodeledger-held-a"), ("PATCH", "a")]
    assert (api.labelled, placeholders.refusals, gauge(metrics)) == (set(), None, 0)
    assert api.requests("a") == {"cpu": "4000m", "memory": str(GIB)}


def test_a_node_that_needs_no_placeholder_any_more_is_back_at_once(
    refused: tuple[Placeholders, FakeApi, Clock, Metrics], ledger: Ledger
) -> None:
    placeholders, api, clock, _ = refused
    api.refuse = KubeError(f"POST pods: 403 {FORBIDDEN}", 403)
    step(placeholders)
    clock.now += REFUSED_BOUND
    step(placeholders)
    assert api.labelled == {"a"}
    ledger.release("m1", HolderKind.MANUAL)
    assert step(placeholders) == [("PATCH", "a")]
    assert api.labelled == set()


def test_a_refused_resize_is_made_again_at_its_size(
    refused: tuple[Placeholders, FakeApi, Clock, Metrics], ledger: Ledger
) -> None:
    """A resize the API server refuses (a change of QoS class, as limits equal requests, when
    CPU or memory crosses zero; a placeholder of an older shape): deleted, and made again
    on its DELETED event."""
    placeholders, api, clock, _ = refused
    assert step(placeholders) == [("POST", "nodeledger-held-a")]
    ledger.admit("a", Holder(HolderKind.MANUAL, "m2"), Resources(1000, 0))
    api.refuse = KubeError("PATCH pods/resize: 422 Pod QOS Class may not change", 422)
    assert step(placeholders) == [("PATCH", "refused"), ("DELETE", "nodeledger-held-a")]
    api.refuse = None
    body = api.pods.get("nodeledger-held-a") or placeholder.pod("a", "", NODE, namespace="nl",
                                                                 image="pause")  # fmt: skip
    placeholders.on_event("DELETED", placeholders.decode(body))
    clock.now += 1
    assert step(placeholders) == [("POST", "nodeledger-held-a")]
    assert api.requests("a") == {"cpu": "5000m", "memory": str(GIB)}
    assert placeholders._refused == {}


def test_an_outage_is_no_refusal_and_a_former_leaders_label_goes(
    refused: tuple[Placeholders, FakeApi, Clock, Metrics], ledger: Ledger
) -> None:
    placeholders, api, _, _ = refused
    api.refuse = KubeError("POST pods: connection refused", None)
    with pytest.raises(KubeError):  # the run loop's log_failure: one DEBUG line an outage
        step(placeholders)
    assert placeholders._refused == {}
    # A Node labelled by the last leader, whose placeholder is fine now.
    api.refuse = None
    api.labelled.add("b")
    placeholders.find_labelled()
    assert sorted(step(placeholders)) == [("PATCH", "b"), ("POST", "nodeledger-held-a")]
    assert api.labelled == set()


KUBE_NODE = Resources(16000, 32 * GIB)  # the real Node's capacity


PAUSE = "registry.k8s.io/pause:3.10.1"  # the chart's default kube.placeholders.image


@pytest.fixture
def sqlite_ledger(sqlite_url: str) -> Iterator[Ledger]:
    """The real API server's tests' ledger, on SQLite alone: the ledger is not what they test."""
    database = Database.from_url(sqlite_url, pool_size=20)
    yield Ledger(database)
    database.dispose()


@pytest.fixture
def node(kube_cluster: KubeCluster) -> Iterator[str]:
    kube_cluster.create_node("kp1", cpu=16, memory="32Gi")
    yield "kp1"
    kube_cluster.delete_node("kp1")


def namespace(kube: KubeCluster, name: str, *objects: dict[str, Any], **labels: str) -> None:
    """The namespace (kept: without a kube-controller-manager none is ever finalized) with
    ``labels``, holding ``objects``."""
    meta = {"name": name, "labels": labels}
    kube.apply(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": meta}))
    for obj in objects:
        kube.create({**obj, "metadata": {**obj["metadata"], "namespace": name}})


def empty(kube: KubeCluster, name: str) -> None:
    kube.kubectl("delete", "pods,resourcequotas,limitranges", "--all", "-n", name,
                 "--grace-period=0", "--force", check=False)  # fmt: skip


def controller(kube: KubeCluster, ledger: Ledger, node: str, ns: str) -> Placeholders:
    uid = kube.get("node", node)["metadata"]["uid"]  # type: ignore[index]
    placeholders = Placeholders(
        NodeSnapshot(ledger), KubeClient(kube.kubeconfig), lambda n: NodeRef(KUBE_NODE, uid),
        None, namespace=ns, image=PAUSE, qps=100, burst=100,
    )  # fmt: skip
    ledger.upsert_node(node, NodeSpec(capacity=KUBE_NODE))
    placeholders.snapshot.subscribe(placeholders.mark)
    relist(placeholders)
    placeholders.find_labelled()
    return placeholders


def relist(placeholders: Placeholders) -> None:
    """What the controller's list-watch does on a (re)list of the placeholders."""
    items, _ = placeholders.client.list(
        placeholders.path, placeholders.decode, labelSelector=f"{placeholder.LABEL}=true"
    )
    placeholders.resync(items)


def resources(kube: KubeCluster, node: str, ns: str) -> dict[str, Any] | None:
    pod = kube.get("pod", placeholder.pod_name(node), namespace=ns)
    return None if pod is None else pod["spec"]["containers"][0]["resources"]


LIMIT_RANGE = {
    "apiVersion": "v1",
    "kind": "LimitRange",
    "metadata": {"name": "site"},
    "spec": {
        "limits": [
            {
                "type": "Container",
                # What a pod without limits gets, and at most what any may ask.
                "default": {"cpu": "100m", "memory": "64Mi"},
                "defaultRequest": {"cpu": "100m", "memory": "64Mi"},
                "max": {"cpu": "16", "memory": "32Gi"},
            }
        ]
    },
}


@pytest.mark.kube
@pytest.mark.kube_api  # Pod Security, LimitRange and the resize subresource, on every minor
def test_placeholders_pass_pod_security_restricted_and_a_limit_range(
    kube_cluster: KubeCluster, sqlite_ledger: Ledger, node: str
) -> None:
    """Created, resized up and down in memory and CPU, and made again when a resource
    crosses zero (a change of QoS class, which no resize may make), in a namespace that
    enforces Pod Security "restricted" and has a LimitRange."""
    ledger = sqlite_ledger
    ns = "nl-restricted"
    namespace(kube_cluster, ns, LIMIT_RANGE, **{"pod-security.kubernetes.io/enforce": "restricted"})
    try:
        placeholders = controller(kube_cluster, ledger, node, ns)
        ledger.admit(node, Holder(HolderKind.MANUAL, "m1"), Resources(4000, GIB))
        one_pass(placeholders)
        assert placeholders._refused == {}, placeholders._refused
        quantities = {"cpu": "4", "memory": str(GIB)}
        assert resources(kube_cluster, node, ns) == {"requests": quantities, "limits": quantities}
        ledger.admit(node, Holder(HolderKind.MANUAL, "m2"), Resources(2000, 2 * GIB))
        one_pass(placeholders)
        assert resources(kube_cluster, node, ns)["limits"] == {"cpu": "6", "memory": str(3 * GIB)}  # type: ignore[index]
        ledger.release("m2", HolderKind.MANUAL)  # down again, memory limit included
        one_pass(placeholders)
        assert resources(kube_cluster, node, ns)["limits"] == quantities  # type: ignore[index]
        ledger.release("m1", HolderKind.MANUAL)
        ledger.admit(node, Holder(HolderKind.MANUAL, "m4"), Resources(1000, 0))
        one_pass(placeholders)  # no memory held: a resize would change the QoS class
        relist(placeholders)  # the watch's DELETED event
        one_pass(placeholders)
        assert placeholders._refused == {}, placeholders._refused
        got = resources(kube_cluster, node, ns)
        assert got is not None
        assert got["requests"] == got["limits"] == {"cpu": "1", "memory": "0"}
        assert placeholders.refusals is None
    finally:
        empty(kube_cluster, ns)


def labels_of(kube: KubeCluster, node: str) -> dict[str, str]:
    labels: dict[str, str] = kube.get("node", node)["metadata"].get("labels", {})  # type: ignore[index]
    return labels


@pytest.mark.kube
def test_a_refused_placeholder_keeps_its_node_from_the_scheduler_and_says_so(
    kube_cluster: KubeCluster, sqlite_url: str, tmp_path: Path
) -> None:
    """`nodeledger serve` whose placeholders a ResourceQuota of no pods refuses: after
    REFUSED_BOUND (not before) the Node is labelled for the chart's scheduler to keep off,
    /readyz is degraded naming the refusal, the metric counts the node; once the quota is
    gone the placeholder is made, the label goes and /readyz is ok again."""
    ns = "nl-quota"
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "none"},
             "spec": {"hard": {"pods": "0"}}}  # fmt: skip
    namespace(kube_cluster, ns, quota)
    # What the quota controller (no kube-controller-manager here) would say it is at.
    kube_cluster.patch_status("resourcequota", "none", {"hard": {"pods": "0"},
                              "used": {"pods": "0"}}, namespace=ns)  # fmt: skip
    kube_cluster.apply(CRD.read_text())
    kube_cluster.create_node("kp2", cpu=16, memory="32Gi", labels={"nodeledger.io/policy": "t"})
    env = {
        "NODELEDGER_KUBE_ENABLED": "true",
        "NODELEDGER_KUBE_KUBECONFIG": str(kube_cluster.kubeconfig),
        "NODELEDGER_KUBE_NODE_SELECTOR": "nodeledger.io/policy=t",
        "NODELEDGER_KUBE_LEADER_ELECTION": "false",
        "NODELEDGER_KUBE_PLACEHOLDERS": "true",
        "NODELEDGER_KUBE_PLACEHOLDER_NAMESPACE": ns,
        "NODELEDGER_KUBE_PLACEHOLDER_IMAGE": PAUSE,
    }
    try:
        with running_service(sqlite_url, tmp_path, env=env) as service:
            api = httpx.Client(base_url=service.url, timeout=10)
            wait_until(lambda: api.get("/v1/nodes/kp2").status_code == 200, 60,
                       what="kp2 discovered")  # fmt: skip
            body = {"node": "kp2", "holder": {"kind": "manual", "id": "m1"},
                    "requests": {"cpu": "4", "memory": "1Gi"}}  # fmt: skip
            assert api.post("/v1/admissions", json=body).status_code == 201
            held = time.monotonic()
            wait_until(lambda: labels_of(kube_cluster, "kp2").get(placeholder.REFUSED_LABEL),
                       REFUSED_BOUND + 40, interval=0.2, what="kp2 labelled")  # fmt: skip
            assert time.monotonic() - held >= REFUSED_BOUND
            ready = api.get("/readyz").json()
            assert ready["status"] == "degraded"
            [detail] = [c for c in ready["checks"].values() if "placeholder pods refused" in c]
            assert "on 1 node(s)" in detail
            assert "exceeded quota" in detail
            assert "nodeledger_kube_placeholders_refused 1.0" in api.get("/metrics").text
            kube_cluster.kubectl("delete", "resourcequota", "none", "-n", ns)

            def placed() -> bool:
                return (kube_cluster.get("pod", placeholder.pod_name("kp2"), namespace=ns)
                        is not None and placeholder.REFUSED_LABEL
                        not in labels_of(kube_cluster, "kp2"))  # fmt: skip

            wait_until(placed, 120, interval=0.5, what="placeholder made, kp2 unlabelled")
            wait_until(lambda: api.get("/readyz").json()["status"] == "ok", 30,
                       what="/readyz ok")  # fmt: skip
            assert "nodeledger_kube_placeholders_refused 0.0" in api.get("/metrics").text
            assert service.log().count("refused, tried again") == 1  # not one a try
    finally:
        empty(kube_cluster, ns)
        kube_cluster.delete_node("kp2")
        kube_cluster.delete("genericnodes")


@pytest.mark.kube
def test_the_charts_scheduler_keeps_off_a_node_whose_placeholder_is_refused(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    """The real kube-scheduler on the chart's placeholder configuration: a pod is not
    placed on a managed Node labelled refused; once the label goes it is (its bind, to an
    extender not listening here, is what fails then)."""
    managed = ("nodeledger.io/policy", "s")
    labels = {managed[0]: managed[1], placeholder.REFUSED_LABEL: "true"}
    kube_cluster.create_node("kp3", cpu=16, memory="32Gi", labels=labels)
    config = scheduler_config(tmp_path / "scheduler.yaml", kube_cluster, "http://127.0.0.1:9",
                              PLACEHOLDER_CONFIG, managed=managed)  # fmt: skip
    kube_cluster.start_scheduler("nodeledger", config, free_port())
    container = {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "steered", "namespace": "default"},
           "spec": {"schedulerName": "nodeledger", "containers": [container]}}  # fmt: skip

    def events(name: str) -> str:
        out = kube_cluster.kubectl("get", "events", "-n", "default", "--field-selector",
                                   f"involvedObject.name={name}", "-o", "json")  # fmt: skip
        return " ".join(e.get("message", "") for e in json.loads(out)["items"])

    try:
        kube_cluster.create(pod)
        wait_until(lambda: "scheduler-enforced node affinity" in events("steered"), 60,
                   what="FailedScheduling")  # fmt: skip
        assert "connection refused" not in events("steered")  # no bind tried
        kube_cluster.kubectl("label", "node", "kp3", f"{placeholder.REFUSED_LABEL}-")
        # A new pod (one already waiting is tried again at the scheduler's next retry of
        # unschedulable pods: a label going is no event its node affinity plugin requeues on).
        kube_cluster.create({**pod, "metadata": {"name": "steered-2", "namespace": "default"}})
        wait_until(lambda: "connection refused" in events("steered-2"), 60,
                   what="a bind to kp3 tried")  # fmt: skip
    finally:
        kube_cluster.stop_scheduler("nodeledger")
        kube_cluster.delete_pod("steered")
        kube_cluster.delete_pod("steered-2")
        kube_cluster.delete_node("kp3")


def token_kubeconfig(kube: KubeCluster, token: str, path: Path) -> Path:
    """The admin kubeconfig's cluster, with a bearer token for its only credential."""
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": "sa", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "sa"
    path.write_text(yaml.safe_dump(config))
    return path


def as_service(kube: KubeCluster, config: Path, *args: str, body: Any = None) -> str:
    """kubectl with the service's token: "" when allowed, else what the API server said."""
    result = subprocess.run(
        [kube.kubectl_bin, "--kubeconfig", str(config), *args],
        input=None if body is None else json.dumps(body),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return "" if result.returncode == 0 else result.stderr


@pytest.mark.kube
@pytest.mark.kube_api  # ValidatingAdmissionPolicy on the oldest supported minor too
def test_the_services_token_creates_only_placeholders(
    kube_cluster: KubeCluster,
    helm: Helm,
    tmp_path: Path,
) -> None:
    """The chart's RBAC and admission policy on the API server: with the service's own
    token, a placeholder is created, resized and deleted; a pod with the scheduler's
    ServiceAccount, a hostPath, another image, a command, or any pod not a placeholder is
    refused."""
    ns, release = "nl-identity", "nlpol"
    shown = [f"--show-only=templates/{t}.yaml"
             for t in ("rbac", "placeholders", "admission-policy")]  # fmt: skip
    manifests = run(helm, "template", release, str(CHART), "--namespace", ns,
                    "--kube-version", helm.kube_version, *shown).stdout  # fmt: skip
    namespace(kube_cluster, ns)
    kube_cluster.create_node("kp9", cpu=16, memory="32Gi")  # a resize needs its pod's Node
    sa = f"{release}-nodeledger"
    try:
        kube_cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifests)
        scheduler_sa = {"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": f"{sa}-scheduler", "namespace": ns}}  # fmt: skip
        kube_cluster.apply(json.dumps(scheduler_sa))
        token = kube_cluster.kubectl("create", "token", sa, "-n", ns).strip()
        config = token_kubeconfig(kube_cluster, token, tmp_path / "service.kubeconfig")
        # The policy is enforced once the API server has loaded it (a few seconds).
        good = placeholder.pod("kp9", "", Resources(1000, GIB), namespace=ns, image=PAUSE,
                               priority_class=f"{sa}-placeholder")  # fmt: skip
        probe = {**good, "metadata": {**good["metadata"], "name": "probe"}}
        wait_until(lambda: "denied" in as_service(kube_cluster, config, "create", "-f", "-",
                                                  body=probe), 60, interval=1,
                   what="the admission policy loaded")  # fmt: skip
        assert as_service(kube_cluster, config, "create", "-f", "-", body=good) == ""

        def variant(change: dict[str, Any], container: dict[str, Any] | None = None) -> str:
            pod = json.loads(json.dumps(good))
            pod["spec"].update(change)
            pod["spec"]["containers"][0].update(container or {})
            pod["metadata"]["name"] = placeholder.pod_name("kp8")
            return as_service(kube_cluster, config, "create", "-f", "-", body=pod)

        scheduler = variant({"serviceAccountName": f"{sa}-scheduler",
                             "automountServiceAccountToken": True})  # fmt: skip
        assert "default ServiceAccount" in scheduler
        host = variant({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
                       {"volumeMounts": [{"name": "root", "mountPath": "/host"}]})  # fmt: skip
        assert "no volume" in host
        assert "host namespace" in variant({"hostPID": True})
        assert "kube.placeholders.image" in variant({}, {"image": "busybox"})
        assert "kube.placeholders.image" in variant({}, {"command": ["/bin/sh"]})
        assert "PriorityClass" in variant({"priorityClassName": "system-node-critical"})
        other = {**good, "metadata": {"name": "worker", "namespace": ns}}
        assert "only placeholder pods" in as_service(kube_cluster, config, "create", "-f", "-",
                                                     body=other)  # fmt: skip
        # Another user's pod in the namespace (the scheduler's): the service may not delete
        # it; its own placeholder it resizes and deletes.
        kube_cluster.create(other)
        assert "only placeholder pods" in as_service(kube_cluster, config, "delete", "pod",
                                                     "worker", "-n", ns)  # fmt: skip
        name = good["metadata"]["name"]
        # As the service resizes (kubectl would read pods/resize first, which it may not).
        service = KubeClient(config)
        service.request(
            "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/resize",
            body=placeholder.resize(Resources(2000, GIB)),
            content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
        pod = kube_cluster.get("pod", name, namespace=ns)
        assert pod_info(pod).requests == Resources(2000, GIB)  # type: ignore[arg-type]
        service.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                        body={"gracePeriodSeconds": 0})  # fmt: skip
    finally:
        kube_cluster.kubectl("delete", "-n", ns, "-f", "-", "--ignore-not-found", input=manifests,
                             check=False)  # fmt: skip
        empty(kube_cluster, ns)
        kube_cluster.delete_node("kp9")
