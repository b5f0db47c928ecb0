"""Kubernetes mode against the real kube-apiserver (RBAC on): ServiceAccount tokens from
the TokenRequest API, checked with real TokenReviews, authorized with real
SubjectAccessReviews against ClusterRoles granted the way the README says; and the
chart's design end to end: a real kube-scheduler binds through the extender over HTTPS,
authenticated by its client certificate only.

Every object here is uniquely named and deleted afterwards, in a namespace kept between
runs (without a namespace controller a deleted namespace never goes away)."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from cachetools import TTLCache
from fastapi.testclient import TestClient

from app.auth.model import Identity, Permission
from app.auth.reviews import AccessReviewer
from app.auth.settings import AuthSettings
from app.core.records import NodeSpec
from app.core.resources import Resources
from app.kube.client import KubeClient
from app.kube.reviews import KubeReviews
from app.kube.settings import KubeSettings
from app.main import create_app
from app.settings import Settings
from tests.auth.fakes import admission, bearer
from tests.auth.pki import CA
from tests.auth.serve import tls_service
from tests.support.kube_cluster import KubeCluster, wait_until
from tests.support.net import free_port
from tests.support.realenv import REPO

pytestmark = [pytest.mark.kube, pytest.mark.kube_api, pytest.mark.anyio]
NS = "nodeledger-auth-test"
CRD = Path(REPO) / "crds" / "genericnodes.nodeledger.io.yaml"
ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {name}
rules:
  - apiGroups: [nodeledger.io]
    resources: [{resource}]
    verbs: [{verbs}]
"""


@dataclass
class Objects:
    """Cluster objects of one test, named with a unique prefix, deleted at the end."""

    kube: KubeCluster
    prefix: str
    created: list[tuple[str, ...]]

    def name(self, what: str) -> str:
        return f"{self.prefix}-{what}"

    def service_account(self, what: str) -> str:
        name = self.name(what)
        self.kube.kubectl("create", "serviceaccount", name, "-n", NS)
        self.created.append(("serviceaccount", name, "-n", NS))
        return name

    def token(self, account: str) -> str:
        """A bound token through the TokenRequest API (POST .../serviceaccounts/NAME/token)."""
        return self.kube.kubectl("create", "token", account, "-n", NS, "--duration=10m").strip()

    def grant(self, what: str, account: str, verbs: str, resource: str) -> str:
        """The README's example: a ClusterRole on a nodeledger.io resource (a manifest:
        `kubectl create clusterrole` refuses resources the API server does not serve),
        bound to a ServiceAccount."""
        role = self.name(what)
        self.kube.apply(ROLE.format(name=role, resource=resource, verbs=verbs))
        self.created.append(("clusterrole", role))
        self.bind(role, role, account)
        return role

    def bind(self, binding: str, role: str, account: str) -> None:
        self.kube.kubectl("create", "clusterrolebinding", binding, f"--clusterrole={role}",
                          f"--serviceaccount={NS}:{account}")  # fmt: skip
        self.created.append(("clusterrolebinding", binding))

    def kubeconfig(self, path: Path, token: str, server: str | None = None) -> Path:
        """A kubeconfig of this cluster that authenticates with ``token``."""
        admin = yaml.safe_load(self.kube.kubeconfig.read_text())
        cluster = {**admin["clusters"][0]["cluster"]}
        cluster["server"] = server or cluster["server"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "c", "cluster": {**cluster, "server": server or cluster["server"]}}
            ],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        }
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def cleanup(self) -> None:
        for args in reversed(self.created):
            self.kube.kubectl("delete", *args, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def objects(kube_cluster: KubeCluster) -> Iterator[Objects]:
    if kube_cluster.get("namespace", NS) is None:
        kube_cluster.kubectl("create", "namespace", NS, check=False)  # a racing run may win
    made = Objects(kube_cluster, f"nla-{uuid.uuid4().hex[:8]}", [])  # CNs <= 64 characters
    try:
        yield made
    finally:
        made.cleanup()


@dataclass
class Callers:
    app: TestClient
    writer: str
    outsider: str
    writer_account: str


@pytest.fixture
def callers(objects: Objects, sqlite_url: str, tmp_path: Path) -> Iterator[Callers]:
    """The service in-process, reviewing as a ServiceAccount that only holds
    system:auth-delegator (what the chart grants); a writer allowed to create admissions;
    an outsider allowed nothing."""
    service = objects.service_account("service")
    objects.bind(objects.name("delegator"), "system:auth-delegator", service)
    writer, outsider = objects.service_account("writer"), objects.service_account("outsider")
    objects.grant("admit", writer, "create", "admissions")
    settings = Settings(
        database_url=sqlite_url,
        migrate_on_start=False,
        auth=AuthSettings(mode="kubernetes", cache_ttl=1.0),
        kube=KubeSettings(kubeconfig=objects.kubeconfig(tmp_path / "svc", objects.token(service))),
    )
    app = create_app(settings)
    app.state.services.ledger.upsert_node("n1", NodeSpec(Resources(8000, 16 * 2**30)))
    with TestClient(app) as client:
        yield Callers(client, objects.token(writer), objects.token(outsider), writer)


def test_401_403_201_from_real_reviews(
    callers: Callers, objects: Objects, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    api = callers.app
    anonymous = api.post("/v1/admissions", json=admission())
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == 'Bearer realm="nodeledger"'

    forged = api.post("/v1/admissions", json=admission(), headers=bearer("not-a-real-token-xyz"))
    assert forged.status_code == 401
    assert "bearer token is not valid" in forged.json()["detail"]

    outsider = api.post("/v1/admissions", json=admission(), headers=bearer(callers.outsider))
    assert outsider.status_code == 403, outsider.text
    assert outsider.json()["detail"].startswith(
        f'user "system:serviceaccount:{NS}:{objects.name("outsider")}" may not '
        'create admissions.nodeledger.io "n1"'
    )

    admitted = api.post("/v1/admissions", json=admission(), headers=bearer(callers.writer))
    assert admitted.status_code == 201, admitted.text
    # The grant is "create" only.
    release = api.delete("/v1/admissions/u1", headers=bearer(callers.writer))
    assert release.status_code == 403
    assert 'may not delete admissions.nodeledger.io "u1"' in release.json()["detail"]

    for token in (callers.writer, callers.outsider, "not-a-real-token-xyz"):
        assert token not in caplog.text


def test_a_revoked_grant_stops_working_within_the_cache_ttl(
    callers: Callers, objects: Objects
) -> None:
    api, writer = callers.app, bearer(callers.writer)
    assert api.post("/v1/admissions", json=admission(uid="a"), headers=writer).status_code == 201
    objects.kube.kubectl("delete", "clusterrolebinding", objects.name("admit"))
    wait_until(
        lambda: (
            api.post("/v1/admissions", json=admission(uid="b"), headers=writer).status_code == 403
        ),
        10,
        0.2,
        "the revoked grant to be refused",
    )


def test_a_service_without_review_rights_answers_503(
    objects: Objects, sqlite_url: str, tmp_path: Path
) -> None:
    powerless = objects.service_account("powerless")
    writer = objects.service_account("writer")
    settings = Settings(
        database_url=sqlite_url,
        migrate_on_start=False,
        auth=AuthSettings(mode="kubernetes"),
        kube=KubeSettings(kubeconfig=objects.kubeconfig(tmp_path / "k", objects.token(powerless))),
    )
    with TestClient(create_app(settings)) as api:
        answer = api.put("/v1/nodes/n1", json={}, headers=bearer(objects.token(writer)))
    assert answer.status_code == 503
    body = answer.json()
    assert body["code"] == "auth_unavailable"
    assert "tokenreviews" in body["detail"]
    assert "403" in body["detail"]


def test_an_unreachable_api_server_answers_503(
    objects: Objects, sqlite_url: str, tmp_path: Path
) -> None:
    nowhere = objects.kubeconfig(
        tmp_path / "k", "some-token-value-1234", server=f"https://127.0.0.1:{free_port()}"
    )
    settings = Settings(
        database_url=sqlite_url,
        migrate_on_start=False,
        auth=AuthSettings(mode="kubernetes", review_timeout=2),
        kube=KubeSettings(kubeconfig=nowhere),
    )
    with TestClient(create_app(settings)) as api:
        answer = api.post("/v1/admissions", json=admission(), headers=bearer("a-caller-token-5678"))
    assert answer.status_code == 503
    assert answer.json()["retryable"] is True
    assert "review by the Kubernetes API server failed" in answer.json()["detail"]
    assert "a-caller-token-5678" not in answer.text


async def test_a_certificate_user_named_after_a_service_account_is_authorized_by_its_binding(
    objects: Objects,
) -> None:
    """What the chart relies on: the scheduler's client certificate carries its
    ServiceAccount's user name, and RBAC matches a ServiceAccount subject by that name."""
    scheduler = objects.service_account("scheduler")
    user = f"system:serviceaccount:{NS}:{scheduler}"
    access = AccessReviewer(
        KubeReviews(KubeClient(objects.kube.kubeconfig)), TTLCache(maxsize=1, ttl=0)
    )
    bind = Permission("create", "bindings", "kn1")
    identity = Identity.of(user, via="certificate")
    assert not (await access.authorize(identity, bind)).allowed
    objects.grant("extender", scheduler, "create", "bindings")
    decision = await wait_until_allowed(access, identity, bind)
    assert decision


async def wait_until_allowed(access: AccessReviewer, identity: Identity, p: Permission) -> bool:
    for _ in range(50):
        if (await access.authorize(identity, p)).allowed:
            return True
        await anyio.sleep(0.2)
    return False


# ------------------------------------------------------------ the scheduler, end to end


def scheduler_config(path: Path, kube: KubeCluster, name: str, url: str, client: Any) -> Path:
    """What the chart renders (charts/nodeledger/templates/_helpers.tpl), pointed here."""
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kube.scheduler_kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name}],
        "extenders": [
            {
                "urlPrefix": f"{url}/v1/extender",
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": 5,
                "nodeCacheCapable": True,
                "ignorable": False,
                "httpTimeout": "10s",
                "enableHTTPS": True,
                "tlsConfig": {
                    "insecure": False,
                    "caFile": str(client.ca),
                    "certFile": str(client.cert),
                    "keyFile": str(client.key),
                },
            }
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass(frozen=True)
class ClientFiles:
    ca: Path
    cert: Path
    key: Path


def test_the_charts_scheduler_binds_with_its_client_certificate_only(
    objects: Objects, kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    kube = kube_cluster
    kube.apply(CRD.read_text())
    scheduler_account = objects.service_account("sched")
    user = f"system:serviceaccount:{NS}:{scheduler_account}"
    ca = CA.create(tmp_path / "pki")
    pair = ca.client("scheduler", user)
    node, label, taint = objects.name("node"), objects.name("managed"), objects.name("only")
    kube.create_node(node, cpu=4, memory="8Gi", labels={label: "true"})
    objects.created.append(("node", node))
    objects.created.append(("genericnode", node))
    # Only this test's pods go there.
    kube.kubectl("patch", "node", node, "--type=merge", "-p", json.dumps(
        {"spec": {"taints": [{"key": taint, "value": "x", "effect": "NoSchedule"}]}}))  # fmt: skip
    env = {
        "NODELEDGER_AUTH_MODE": "kubernetes",
        "NODELEDGER_AUTH_CACHE_TTL": "1",
        "NODELEDGER_KUBE_ENABLED": "true",
        "NODELEDGER_KUBE_KUBECONFIG": str(kube.kubeconfig),
        "NODELEDGER_KUBE_NODE_SELECTOR": f"{label}=true",
        "NODELEDGER_KUBE_LEASE_NAME": objects.name("lease"),
        "NODELEDGER_KUBE_LEASE_NAMESPACE": NS,
        "NODELEDGER_KUBE_IDENTITY": objects.name("replica"),
    }
    scheduler_name = objects.name("scheduler")
    with tls_service(tmp_path, ca, env) as service, service.client() as reader:
        wait_until(
            lambda: reader.get(f"/v1/nodes/{node}").status_code == 200, 30, 0.2, "node discovered"
        )
        config = scheduler_config(
            tmp_path / "scheduler.yaml", kube, scheduler_name, service.url,
            ClientFiles(ca.cert, pair.cert, pair.key),
        )  # fmt: skip
        kube.start_scheduler(scheduler_name, config, free_port())
        try:
            pod = kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": objects.name("pod"), "namespace": NS},
                    "spec": {
                        "schedulerName": scheduler_name,
                        "tolerations": [{"key": taint, "operator": "Exists"}],
                        "containers": [
                            {
                                "name": "c",
                                "image": "busybox",
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                            }
                        ],
                    },
                }
            )
            objects.created.append(("pod", pod["metadata"]["name"], "-n", NS, "--force",
                                    "--grace-period=0"))  # fmt: skip
            # 1. Not yet allowed: the bind is refused (403) and the pod stays unbound.
            denied = f'denied: user "{user}" may not create bindings.nodeledger.io "{node}"'
            wait_until(lambda: denied in service.log.read_text(), 30, 0.2, "the refused bind")
            assert kube.pod_node(pod["metadata"]["name"], NS) is None
            # 2. What the chart grants the scheduler's ServiceAccount: the next retry binds.
            objects.grant("extender", scheduler_account, "create", "bindings")
            bound = kube.wait_bound(pod["metadata"]["name"], NS, timeout=60)
            assert bound == node
            holdings = reader.get("/v1/holdings", params={"node": node}).json()
            assert [h["holder"]["id"] for h in holdings] == [pod["metadata"]["uid"]]
        finally:
            with contextlib.suppress(Exception):
                kube.stop_scheduler(scheduler_name)
            kube.delete_pod(objects.name("pod"), NS)
