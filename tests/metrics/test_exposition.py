"""/metrics through the application on a real SQLite ledger: every series of the contract
is there, each admission result moves its own counter, whichever way it came in, and the
ledger's gauges are in base units."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.auth.settings import AuthSettings
from app.core.caps import KubeCaps
from app.core.resources import Resources
from app.kube.client import KubeError
from app.kube.controllers.admission_requests import AdmissionRequests, requests_of
from app.kube.extender.service import Extender
from app.kube.extender.wire import ExtenderBindingArgs
from app.ledger.snapshot import NodeSnapshot
from app.main import create_app
from app.metrics.settings import MetricsSettings
from app.settings import Settings
from tests.auth.fakes import READER_TOKEN, STATIC_ENTRIES, bearer, write_tokens
from tests.metrics.apps import MakeApp
from tests.metrics.scrape import scrape
from tests.slurm.helpers import admit
from tests.support.fake_kube import FakeStatusClient
from tests.support.headroom import set_headroom

GIB = 2**30

# The contract (family name as the exposition parser reports it, counters without _total).
CONTRACT = {
    "nodeledger_build_info": "gauge",
    "nodeledger_admissions": "counter",
    "nodeledger_admissions_within_headroom": "counter",
    "nodeledger_releases": "counter",
    "nodeledger_admission_duration_seconds": "histogram",
    "nodeledger_extender_request_duration_seconds": "histogram",
    "nodeledger_extender_bytes": "counter",
    "nodeledger_slurm_request_duration_seconds": "histogram",
    "nodeledger_slurm_pushes": "counter",
    "nodeledger_slurm_pushes_coalesced": "counter",
    "nodeledger_slurm_drift_corrections": "counter",
    "nodeledger_slurm_sync_duration_seconds": "histogram",
    "nodeledger_slurm_drifted_nodes": "gauge",
    "nodeledger_node_capacity": "gauge",
    "nodeledger_node_held": "gauge",
    "nodeledger_node_free": "gauge",
    "nodeledger_node_admissible_capacity": "gauge",
    "nodeledger_node_admissible": "gauge",
    "nodeledger_node_headroom_target": "gauge",
    "nodeledger_node_headroom_granted": "gauge",
    "nodeledger_node_gpu_device_holder": "gauge",
    "nodeledger_cluster_capacity": "gauge",
    "nodeledger_cluster_held": "gauge",
    "nodeledger_cluster_free": "gauge",
    "nodeledger_cluster_headroom_target": "gauge",
    "nodeledger_cluster_headroom_granted": "gauge",
    "nodeledger_cluster_headroom_free": "gauge",
    "nodeledger_nodes": "gauge",
    "nodeledger_nodes_overcommitted": "gauge",
    "nodeledger_leader": "gauge",
    "nodeledger_kube_watch_restarts": "counter",
    "nodeledger_kube_relists": "counter",
    "nodeledger_kube_status_writes": "counter",
    "nodeledger_kube_orphaned_pod_holdings": "gauge",
}
PER_NODE = {name for name in CONTRACT if name.startswith("nodeledger_node_")}


def test_metrics_exposes_every_series_of_the_contract(make_app: MakeApp) -> None:
    app = make_app()
    assert admit(app.api, "n1", "u1", "1").status_code == 201
    s = scrape(app.api)
    assert {name: s.families.get(name) for name in CONTRACT} == CONTRACT
    assert s.value("nodeledger_build_info", version="0.1.0") == 1
    # Bounded label sets exist from the start, at zero.
    assert s.has("nodeledger_admissions_total", path="genericnode", result="failed_closed")
    assert s.has("nodeledger_releases_total", path="kubernetes")
    assert s.has("nodeledger_slurm_pushes_total", reason="drift")
    # Slurm freshness only exists with a Slurm sync (none here): no false "Slurm down".
    assert "nodeledger_slurm_up" not in s.families
    assert "nodeledger_slurm_staleness_seconds" not in s.families


def test_each_admission_result_moves_its_counter(make_app: MakeApp) -> None:
    app = make_app(caps=KubeCaps(cpu_fraction=0.5))
    assert admit(app.api, "n1", "ok", "1").status_code == 201
    assert admit(app.api, "n1", "ok", "1").status_code == 200  # the same holder again
    assert admit(app.api, "n1", "too-big", "100").status_code == 409  # does not fit
    assert admit(app.api, "nowhere", "lost", "1").status_code == 404  # unknown node
    assert admit(app.api, "n1", "over-cap", "9").status_code == 409  # over Kubernetes' half
    # A job Slurm started meanwhile: its GRES is counted on the node.
    app.slurm.node = replace(app.slurm.node, gres_used="k8scpu:14,k8smemory:100")
    overlap = admit(app.api, "n1", "overlap", "4")
    assert "Slurm already holds it" in overlap.json()["detail"]
    app.slurm.node = replace(app.slurm.node, gres_used="")
    app.slurm.down = True
    down = admit(app.api, "n1", "down", "1")
    assert "Slurm cannot confirm" in down.json()["detail"]
    app.slurm.down = False
    assert app.api.delete("/v1/admissions/ok").status_code == 200

    s = scrape(app.api)
    results = {
        dict(labels)["result"]: value
        for labels, value in s.series("nodeledger_admissions_total").items()
        if dict(labels)["path"] == "rest"
    }
    assert results == {
        "admitted": 2,
        "rejected_ledger": 2,
        "rejected_slurm": 2,
        "failed_closed": 1,
    }
    assert s.value("nodeledger_releases_total", path="rest") == 1
    # Phases: every admission that reached the ledger; Slurm for those the gate saw (the
    # first "ok" and the three it refused; the repeat was already held).
    assert s.value("nodeledger_admission_duration_seconds_count", phase="ledger") == 7
    assert s.value("nodeledger_admission_duration_seconds_count", phase="slurm") == 4
    assert s.value("nodeledger_admission_duration_seconds_sum", phase="ledger") > 0
    # Pushes ran for "ok", "overlap" and "down" (the cap refuses before pushing), and for
    # the release and the three holds undone (the one while Slurm was down failed).
    assert s.value("nodeledger_slurm_pushes_total", reason="admission") == 3
    assert s.value("nodeledger_slurm_pushes_total", reason="release") == 4
    assert s.value("nodeledger_slurm_pushes_coalesced_total") == 0


def test_extender_and_genericnode_admissions_count_under_their_path(make_app: MakeApp) -> None:
    app = make_app(gated=False)
    admissions = app.services.admissions

    class FakeKube(FakeStatusClient):
        bind_error: KubeError | None = None

        def request(self, method: str, path: str) -> dict[str, Any]:
            name = path.rsplit("/", 1)[-1]
            cpu = "100" if name == "huge" else "1"
            return {
                "metadata": {"name": name, "uid": f"uid-{name}"},
                "spec": {"containers": [{"resources": {"requests": {"cpu": cpu}}}]},
            }

        def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
            if self.bind_error is not None:
                raise self.bind_error

    kube = FakeKube()
    extender = Extender(
        admissions,
        kube,  # type: ignore[arg-type]
        None,
        gpu_resource="nvidia.com/gpu",
        snapshot=NodeSnapshot(admissions.ledger),
    )

    def bind(name: str) -> str:
        args = ExtenderBindingArgs(PodName=name, PodNamespace="ns", PodUID=f"uid-{name}", Node="n1")
        return extender.bind(args).Error

    assert bind("web") == ""
    assert "insufficient resources" in bind("huge")
    kube.bind_error = KubeError("conflict", 409)
    assert "binding failed" in bind("raced")  # admitted, then released: binding failed

    protocol = AdmissionRequests(
        admissions,
        kube,  # type: ignore[arg-type]
        gpu_resource="nvidia.com/gpu",
        clock=lambda: datetime.now(UTC),
    )
    protocol.answer(
        requests_of(
            {
                "metadata": {"name": "n1"},
                "spec": {
                    "admissionRequests": [
                        {"podUID": "g1", "namespace": "b", "name": "s0", "requests": {"cpu": "2"}},
                        {"podUID": "g2", "namespace": "b", "name": "s1", "requests": {"cpu": "99"}},
                    ]
                },
            }
        )
    )
    s = scrape(app.api)

    def counted(path: str, result: str) -> float:
        return s.value("nodeledger_admissions_total", path=path, result=result)

    assert (counted("extender", "admitted"), counted("extender", "rejected_ledger")) == (2, 1)
    assert (counted("genericnode", "admitted"), counted("genericnode", "rejected_ledger")) == (1, 1)
    assert s.total("nodeledger_admissions_total", path="rest") == 0
    assert s.value("nodeledger_releases_total", path="extender") == 1


def test_node_gauges_are_in_base_units_and_follow_the_ledger(make_app: MakeApp) -> None:
    app = make_app(gated=False)
    api = app.api
    node = {"capacity": {"cpu": "8", "memory": "16Gi", "gpu": 2}, "reserved": {"cpu": "500m"}}
    api.put("/v1/nodes/g1", json=node).raise_for_status()
    assert admit(api, "g1", "p1", "1500m", "2Gi", gpu=1).status_code == 201
    manual = {"node": "g1", "holder": {"kind": "manual", "id": "ops-1"}, "requests": {"cpu": "1"}}
    assert api.post("/v1/admissions", json=manual).status_code == 201
    s = scrape(api)
    assert s.value("nodeledger_node_capacity", node="g1", resource="cpu") == 8
    assert s.value("nodeledger_node_capacity", node="g1", resource="memory") == 16 * GIB
    assert s.value("nodeledger_node_held", node="g1", resource="cpu", holder="kubernetes") == 1.5
    assert s.value("nodeledger_node_held", node="g1", resource="gpu", holder="kubernetes") == 1
    assert s.value("nodeledger_node_held", node="g1", resource="cpu", holder="manual") == 1
    assert s.has("nodeledger_node_held", node="g1", resource="cpu", holder="slurm")
    assert s.value("nodeledger_node_free", node="g1", resource="cpu") == 5  # 8 - 0.5 - 2.5
    assert s.value("nodeledger_node_free", node="g1", resource="memory") == 14 * GIB
    assert s.value("nodeledger_node_admissible_capacity", node="g1", resource="gpu") == 1
    assert s.value("nodeledger_node_admissible", node="g1") == 1
    assert s.value("nodeledger_cluster_capacity", resource="cpu") == 16 + 8
    assert s.value("nodeledger_cluster_held", resource="cpu", holder="kubernetes") == 1.5
    assert s.value("nodeledger_cluster_free", resource="cpu") == 16 + 5
    assert s.value("nodeledger_nodes", state="admissible") == 2

    # Cordoned: admits nothing, so a pod could get nothing there; forced below its
    # holdings: overcommitted, with a negative free.
    cordoned = {**node, "cordon_reason": "maintenance"}
    api.put("/v1/nodes/g1", json=cordoned).raise_for_status()
    shrunk = {"capacity": {"cpu": "1", "memory": "32000Mi"}}
    api.put("/v1/nodes/n1", json=shrunk).raise_for_status()
    assert admit(api, "n1", "p2", "1", "1Gi").status_code == 201
    api.put("/v1/nodes/n1?force=true", json={**shrunk, "reserved": {"cpu": "500m"}})
    s = scrape(api)
    assert s.value("nodeledger_node_admissible", node="g1") == 0
    assert s.value("nodeledger_node_admissible_capacity", node="g1", resource="cpu") == 0
    assert s.value("nodeledger_node_free", node="g1", resource="cpu") == 5
    assert s.value("nodeledger_node_free", node="n1", resource="cpu") == -0.5
    assert s.value("nodeledger_node_admissible_capacity", node="n1", resource="cpu") == 0
    assert s.value("nodeledger_nodes", state="not_admissible") == 2
    assert s.value("nodeledger_nodes_overcommitted") == 1


def test_headroom_gauges_follow_the_ledger(make_app: MakeApp) -> None:
    app = make_app(gated=False)
    api, ledger = app.api, app.services.ledger
    api.put("/v1/nodes/n2", json={"capacity": {"cpu": "8", "memory": "16Gi"}}).raise_for_status()
    s = scrape(api)
    for node in ("n1", "n2"):  # the headroom off: every figure 0
        for resource in ("cpu", "memory", "gpu"):
            assert s.value("nodeledger_node_headroom_target", node=node, resource=resource) == 0
            assert s.value("nodeledger_node_headroom_granted", node=node, resource=resource) == 0
    assert s.value("nodeledger_cluster_headroom_free", resource="cpu") == 0

    assert admit(api, "n1", "p1", "1500m", "1Gi").status_code == 201
    set_headroom(ledger, "n1", target=Resources(2000, 2 * GIB), granted=Resources(3500, 3 * GIB))
    # n2: held (a reservation of 2 CPUs) beyond its grant, which counts 0 free, not -1.
    manual = {"node": "n2", "holder": {"kind": "manual", "id": "ops"}, "requests": {"cpu": "2"}}
    assert api.post("/v1/admissions", json=manual).status_code == 201
    set_headroom(ledger, "n2", target=Resources(1000), granted=Resources(1000, GIB))
    s = scrape(api)
    assert s.value("nodeledger_node_headroom_target", node="n1", resource="cpu") == 2
    assert s.value("nodeledger_node_headroom_target", node="n1", resource="memory") == 2 * GIB
    assert s.value("nodeledger_node_headroom_granted", node="n1", resource="cpu") == 3.5
    assert s.value("nodeledger_node_headroom_granted", node="n2", resource="memory") == GIB
    assert s.value("nodeledger_cluster_headroom_target", resource="cpu") == 3
    assert s.value("nodeledger_cluster_headroom_granted", resource="cpu") == 4.5
    # n1: 3.5 - 1.5 CPUs, 3Gi - 1Gi; n2: max(1 - 2, 0) CPUs, all of its 1Gi.
    assert s.value("nodeledger_cluster_headroom_free", resource="cpu") == 2
    assert s.value("nodeledger_cluster_headroom_free", resource="memory") == 3 * GIB
    assert s.value("nodeledger_cluster_headroom_free", resource="gpu") == 0


def test_per_node_series_can_be_switched_off(
    make_app: MakeApp, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = scrape(make_app(per_node=False).api)
    assert not PER_NODE & set(s.families)
    assert s.value("nodeledger_cluster_capacity", resource="cpu") == 16
    assert s.value("nodeledger_nodes", state="admissible") == 1

    monkeypatch.setenv("NODELEDGER_METRICS_PER_NODE", "false")
    assert Settings().metrics.per_node is False
    settings = Settings(database_url=sqlite_url, migrate_on_start=False)
    with TestClient(create_app(settings)) as api:
        assert not PER_NODE & set(scrape(api).families)


def test_apps_in_one_process_have_registries_of_their_own(make_app: MakeApp) -> None:
    first, second = make_app(gated=False), make_app(gated=False)
    assert admit(first.api, "n1", "a", "1").status_code == 201
    assert scrape(first.api).value("nodeledger_admissions_total", path="rest", result="admitted")
    assert not scrape(second.api).value(
        "nodeledger_admissions_total", path="rest", result="admitted"
    )


def test_metrics_are_a_guarded_read_when_reads_are_protected(
    sqlite_url: str, tmp_path: Path
) -> None:
    tokens = write_tokens(tmp_path / "tokens.json", STATIC_ENTRIES)
    auth = AuthSettings(mode="static", protect_reads=True, token_file=tokens)
    settings = Settings(database_url=sqlite_url, migrate_on_start=False, auth=auth)
    with TestClient(create_app(settings)) as api:
        assert api.get("/metrics").status_code == 401
        assert api.get("/metrics", headers=bearer(READER_TOKEN)).status_code == 200


def test_openmetrics_and_gzip_when_the_scraper_asks(make_app: MakeApp) -> None:
    api = make_app(gated=False).api
    response = api.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.headers["content-encoding"] == "gzip"  # httpx asks for it and decodes
    assert response.text.rstrip().endswith("# EOF")
    plain = api.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert "nodeledger_build_info" in plain.text


def test_settings_default_to_per_node_series_and_a_five_second_cache() -> None:
    assert MetricsSettings() == MetricsSettings(per_node=True, cache_seconds=5.0)
