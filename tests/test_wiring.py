"""One node snapshot per service, shared by the extender, the Slurm sync and metrics
scrapes, started before them and stopped after them; none without an
integration that reads it. Built,
not started: nothing here reaches a Kubernetes API server or slurmrestd."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from app.bootstrap import build_services
from app.kube.controllers import KubeControllers
from app.kube.settings import KubeSettings
from app.settings import Settings
from app.slurm.settings import SlurmSettings

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def test_both_integrations_share_one_snapshot_that_starts_first(
    sqlite_url: str, tmp_path: Path
) -> None:
    kubeconfig, token = tmp_path / "kubeconfig", tmp_path / "jwt"
    kubeconfig.write_text(KUBECONFIG)
    token.write_text("jwt")
    settings = Settings(
        database_url=sqlite_url,
        migrate_on_start=False,
        slurm=SlurmSettings(enabled=True, token_file=token),
        kube=KubeSettings(enabled=True, kubeconfig=kubeconfig, extender_max_staleness=0.05),
    )
    services = build_services(settings)
    try:
        snapshot = services.snapshot
        assert services.components[0] is snapshot
        assert services.extender is not None
        assert services.extender.snapshot is snapshot
        assert services.extender.max_staleness == 0.05
        assert services.slurm is not None
        assert services.slurm.node_views is snapshot
        # The Kubernetes controllers compare with the ledger itself (node specs and totals
        # summed by the database), not with a snapshot that may trail it.
        assert any(isinstance(c, KubeControllers) for c in services.components)
        assert snapshot.health().message == "not loaded yet"
        generate_latest(services.metrics.registry)  # a scrape reads the nodes from it
        assert snapshot.health().status == "ok"
    finally:
        services.db.dispose()


def test_without_integrations_nothing_runs_a_snapshot(sqlite_url: str) -> None:
    services = build_services(Settings(database_url=sqlite_url, migrate_on_start=False))
    try:
        assert services.components == ()
    finally:
        services.db.dispose()
