"""Slurm unreachable, hung or refusing the token: admissions fail closed with the reason,
ledger reads keep working, /readyz says degraded, and everything recovers by itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.slurm.helpers import admit, gres
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import register_nodes, slurm_settings

pytestmark = pytest.mark.slurm


def readyz(api: TestClient) -> dict[str, object]:
    body: dict[str, object] = api.get("/readyz").json()
    return body


def test_slurmrestd_down_rejects_then_recovers_without_restart(
    slurm_api: TestClient, restd_restarted: SlurmCluster
) -> None:
    slurm = restd_restarted
    slurm.stop_restd()
    rejected = admit(slurm_api, "n1", "pod-x", "1")
    assert rejected.status_code == 409
    assert "Slurm cannot confirm" in rejected.json()["detail"]
    assert "unreachable" in rejected.json()["detail"]
    assert slurm_api.get("/v1/holdings", params={"node": "n1"}).json() == []  # hold undone
    assert slurm_api.get("/v1/nodes/n1").status_code == 200  # reads keep working
    wait_until(lambda: readyz(slurm_api)["status"] == "degraded", 30, what="degraded")
    assert slurm_api.get("/readyz").status_code == 200

    slurm.start_restd()
    wait_until(lambda: readyz(slurm_api)["status"] == "ok", 30, what="ready again")
    assert admit(slurm_api, "n1", "pod-x", "1").status_code == 201
    assert gres(slurm, "n1")["k8scpu"] == 15


@pytest.fixture
def restd_resumed(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    yield slurm
    slurm.resume_restd()


def test_hung_slurmrestd_fails_closed_within_the_timeout(
    restd_resumed: SlurmCluster, sqlite_url: str
) -> None:
    """slurmrestd accepts connections and never answers (SIGSTOP): an admission is refused
    once the timeout and its retries are spent, not left hanging, and nothing is held."""
    slurm = restd_resumed
    settings = slurm_settings(slurm, sqlite_url, timeout=1.0, retries=1)
    with TestClient(create_app(settings)) as api:
        register_nodes(api)
        slurm.pause_restd()
        started = time.monotonic()
        rejected = admit(api, "n2", "pod-h", "1")
        took = time.monotonic() - started
        assert rejected.status_code == 409
        assert "timed out" in rejected.json()["detail"]
        # 1 s timeout x (1 + 1 retry), read and push: about 4 s; without the timeout it
        # would hang for good, so the bound is generous for a busy machine.
        assert took < 20, f"took {took:.1f}s"
        assert api.get("/v1/holdings", params={"node": "n2"}).json() == []
        slurm.resume_restd()
        wait_until(lambda: admit(api, "n2", "pod-h", "1").status_code == 201, 20, what="admitted")
        print(f"a hung slurmrestd refused the admission after {took:.2f}s")


def test_rejected_token_is_the_reason_and_a_rotated_file_fixes_it(
    slurm: SlurmCluster, sqlite_url: str, tmp_path: Path
) -> None:
    token_file = tmp_path / "jwt"
    token_file.write_text("not-a-jwt")
    settings = slurm_settings(slurm, sqlite_url)
    settings.slurm.token_file = token_file
    with TestClient(create_app(settings)) as api:
        register_nodes(api)
        rejected = admit(api, "n1", "pod-t", "1")
        assert rejected.status_code == 409
        assert "token rejected (HTTP 511)" in rejected.json()["detail"]
        token_file.write_text(slurm.token)  # the Secret is rotated: no restart needed
        assert admit(api, "n1", "pod-t", "1").status_code == 201


def test_fail_open_admits_and_the_sync_pushes_when_slurm_is_back(
    restd_restarted: SlurmCluster, sqlite_url: str
) -> None:
    slurm = restd_restarted
    with TestClient(create_app(slurm_settings(slurm, sqlite_url, fail_open=True))) as api:
        register_nodes(api)
        slurm.stop_restd()
        assert admit(api, "n2", "pod-o", "2").status_code == 201
        slurm.start_restd()
        wait_until(lambda: gres(slurm, "n2")["k8scpu"] == 14, 30, what="counts pushed")


def test_kubernetes_cap_leaves_slurm_its_share(slurm: SlurmCluster, sqlite_url: str) -> None:
    settings = slurm_settings(slurm, sqlite_url, kube_max_cpu_fraction=0.5)
    with TestClient(create_app(settings)) as api:
        register_nodes(api, slurm)
        assert admit(api, "n1", "pod-1", "8").status_code == 201
        over = admit(api, "n1", "pod-2", "1")
        assert over.status_code == 409
        assert "cap 8" in over.json()["detail"]
        # A per-node label caps lower than the global fraction.
        body = api.get("/v1/nodes/n2").json()
        api.put(
            "/v1/nodes/n2",
            json={"capacity": {"cpu": "16", "memory": "32000Mi"},
                  "labels": {**body["labels"], "nodeledger.io/kube-max-cpu": "2"}},
        ).raise_for_status()  # fmt: skip
        assert admit(api, "n2", "pod-3", "3").status_code == 409
        assert gres(slurm, "n2")["k8scpu"] == 16
