"""pytest fixtures for the real Slurm clusters: started once per session, reused when up,
and a service wired to it (sync running, admissions confirmed by Slurm)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.slurm.settings import SlurmSettings
from tests.support.realenv import unavailable
from tests.support.slurm_cluster import (
    SLURM_VERSIONS,
    SlurmCluster,
    cluster_sh,
    wait_until,
)

# Ledger node -> Slurm node; the GPU node has a Kubernetes-style name and a Slurm alias.
LEDGER_NODES = {"n1": "n1", "n2": "n2", "gpu-1": "n3"}
QUEUE_MARKER = '"nodeledger":1'  # in a node's Extra: jobs queue behind its pods


@pytest.fixture(scope="session", params=SLURM_VERSIONS, ids=lambda v: f"slurm-{v}")
def slurm_cluster(request: pytest.FixtureRequest) -> SlurmCluster:
    """A cluster of each supported release: every test that uses one runs on each."""
    version: str = request.param
    try:
        cluster_sh(version, "up", timeout=1800)
        return SlurmCluster.from_env(version)
    except Exception as exc:  # any failure to start means the cluster is unavailable
        unavailable(f"Slurm {version} test cluster", str(exc))


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with no jobs and full counts, before and after the test."""
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def slurm_settings(cluster: SlurmCluster, database_url: str, **slurm: Any) -> Settings:
    return Settings(
        database_url=database_url,
        slurm=SlurmSettings(enabled=True, url=cluster.url, token_file=cluster.token_file, **slurm),
    )


def marked(cluster: SlurmCluster) -> bool:
    """Every node of the cluster carries the jobs queue's marker (docs/slurm.md)."""
    return all(QUEUE_MARKER in str(cluster.node(n).get("extra") or "") for n in cluster.nodes)


def register_nodes(api: TestClient, cluster: SlurmCluster | None = None) -> None:
    """The test nodes in the ledger; given the ``cluster``, with the jobs queue on (the
    default), once the sync has marked every Slurm node, so that whether a job gets the
    queue's constraint never depends on how soon the first sync step ran."""
    for name, alias in LEDGER_NODES.items():
        body = {
            "capacity": {"cpu": "16", "memory": "32000Mi", "gpu": 4 if alias == "n3" else 0},
            "slurm_name": alias if alias != name else None,
        }
        api.put(f"/v1/nodes/{name}", json=body).raise_for_status()
    settings = api.app.state.settings.slurm
    if cluster is not None and settings.enabled and settings.jobs_queue:
        wait_until(lambda: marked(cluster), 60, what="every Slurm node marked for the jobs queue")


@contextlib.contextmanager
def service_with_nodes(settings: Settings, cluster: SlurmCluster) -> Iterator[TestClient]:
    """The service of ``settings`` on a database that has the test nodes before it starts
    (registered by the service with Slurm off): its sync's first step, at start, marks
    them, where ``register_nodes`` waits for the next step (a long ``sync_interval``)."""
    with TestClient(create_app(Settings(database_url=settings.database_url))) as plain:
        register_nodes(plain)
    with TestClient(create_app(settings)) as api:
        register_nodes(api, cluster)  # in place already: waits for the marks alone
        yield api


@pytest.fixture
def slurm_api(slurm: SlurmCluster, sqlite_url: str) -> Iterator[TestClient]:
    """The service on SQLite with the Slurm integration on, nodes n1, n2, gpu-1 (= n3)."""
    with TestClient(create_app(slurm_settings(slurm, sqlite_url))) as api:
        register_nodes(api, slurm)
        yield api


@pytest.fixture(params=[True, False], ids=["jobs queue", "no jobs queue"])
def queue_api(
    request: pytest.FixtureRequest, slurm: SlurmCluster, sqlite_url: str
) -> Iterator[TestClient]:
    """``slurm_api`` with the jobs queue on (the default) and off (a site whose slurm.conf
    lacks extra_constraints): ``request.node.callspec.params["queue_api"]`` says which."""
    settings = slurm_settings(slurm, sqlite_url, jobs_queue=request.param)
    with TestClient(create_app(settings)) as api:
        register_nodes(api, slurm)
        yield api


# The service's features that change what it asks Slurm: each on and off, for the tests
# of a promise no feature may break (the defaults: the jobs queue on, the headroom off).
HEADROOM: dict[str, object] = {"headroom_cpu": "2", "headroom_memory": "4Gi"}
FEATURES: dict[str, dict[str, object]] = {
    "defaults": {},
    "headroom on": HEADROOM,
    "no jobs queue": {"jobs_queue": False},
}


@pytest.fixture(params=list(FEATURES))
def features_api(
    request: pytest.FixtureRequest, slurm: SlurmCluster, sqlite_url: str
) -> Iterator[TestClient]:
    """``slurm_api`` with each of FEATURES."""
    with TestClient(
        create_app(slurm_settings(slurm, sqlite_url, **FEATURES[request.param]))
    ) as api:
        register_nodes(api, slurm)
        yield api


@pytest.fixture
def restd_restarted(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, with slurmrestd started again after the test (which may stop it)."""
    yield slurm
    slurm.start_restd()
