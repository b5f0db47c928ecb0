"""Slurm set up wrong: on 26.05 without node_features/k8s_resources the service refuses new
admissions, says why in /readyz, a metric and one ERROR line, and admits again once the
plugin is loaded. Against a real 26.05 cluster of its own (own cache, ports and run
directory, so the session's clusters keep their plugins), up without the plugins, then
with them. plugin_status's table is tested without a cluster."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.slurm.errors import SlurmError
from app.slurm.plugins import JOB_SUBMIT, PLUGIN, PluginCheck, plugin_status
from tests.support import workers
from tests.support.realenv import unavailable
from tests.support.slurm_cluster import SlurmCluster, cluster_sh, seed_cache, wait_until
from tests.support.slurm_fixtures import register_nodes, slurm_settings

VERSION = "26.05"
# Beside the session's clusters and the scale clusters (17400+, 17600+).
PORT_BASE = int(os.environ.get("NODELEDGER_SLURM_PORT_BASE") or workers.port(17200)) + 300
RUNDIR = Path(os.environ.get("NODELEDGER_RUNDIR", "/tmp/nodeledger")) / "plugin-check"


SUBMIT = ["k8s_resource_completion"]


@pytest.mark.parametrize(
    ("release", "plugins", "submit", "safe", "says"),
    [
        ("24.11.5", None, None, True, "not required"),
        ("24.11.5", [], SUBMIT, True, "not required"),
        ("25.11.7", None, None, False, "NODELEDGER_SLURM_PLUGIN_CHECK=warn"),
        ("26.05.3", [], SUBMIT, False, "loaded: none"),
        ("26.05.3", ["node_features/helpers"], SUBMIT, False, "loaded: node_features/helpers"),
        ("26.05.3", [PLUGIN], SUBMIT, True, "loaded"),
        ("26.05.3", [PLUGIN], ["job_submit/k8s_resource_completion"], True, "loaded"),
        ("26.05.3", [PLUGIN], [], False, f"without JobSubmitPlugins={JOB_SUBMIT}"),
        ("26.05.3", [PLUGIN], ["lua"], False, "(loaded: lua)"),
        ("27.05.0", [PLUGIN], SUBMIT, True, "loaded"),
        ("", [], SUBMIT, False, "runs without"),  # an unknown release counts as a new one
    ],
)
def test_the_plugin_status(
    release: str, plugins: list[str] | None, submit: list[str] | None, safe: bool, says: str
) -> None:
    found = plugin_status(release, plugins, submit)
    assert found.safe is safe
    assert says in found.message


def env(plugins: str) -> dict[str, str]:
    return {
        "NODELEDGER_CACHE": str(RUNDIR / "cache"),
        "NODELEDGER_RUNDIR": str(RUNDIR),
        "NODELEDGER_SLURM_PORT_BASE": str(PORT_BASE),
        "NODELEDGER_SLURM_PLUGINS": plugins,
    }


def cluster(plugins: str) -> SlurmCluster:
    """The cluster restarted with the plugins ``on`` or ``off``."""
    cluster_sh(VERSION, "down", timeout=300, check=False, env=env(plugins))
    cluster_sh(VERSION, "up", timeout=1800, env=env(plugins))
    return SlurmCluster.from_env(VERSION, env(plugins))


@pytest.fixture(scope="module")
def cluster_env() -> Iterator[None]:
    try:
        seed_cache(VERSION, RUNDIR / "cache")
    except Exception as exc:  # no built 26.05 chroot to copy
        unavailable(f"Slurm {VERSION} cluster of the plugin check", str(exc))
    yield
    cluster_sh(VERSION, "down", timeout=300, check=False, env=env("on"))


def admission(uid: str) -> dict[str, object]:
    return {
        "node": "n1",
        "holder": {"kind": "pod", "uid": uid},
        "requests": {"cpu": "1", "memory": "1Gi"},
    }


def plugins_ok(api: TestClient) -> str | None:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith("nodeledger_slurm_plugins_ok "):
            return line.split()[1]
    return None


class RefusingConf:
    """A slurmrestd client whose ``GET conf`` is refused (say, a token without the rights)."""

    def plugins(self) -> tuple[str, dict[str, list[str]]]:
        raise SlurmError("slurmrestd GET conf: HTTP 403: Forbidden")


def test_a_check_that_cannot_work_says_why_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="app.slurm.plugins")
    check = PluginCheck(RefusingConf())  # type: ignore[arg-type]
    assert [check.check() for _ in range(3)] == [None, None, None]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["checking Slurm's plugins failed: slurmrestd GET conf: HTTP 403: Forbidden"]


@pytest.mark.slurm
@pytest.mark.slow
def test_without_the_plugin_26_05_admits_nothing_and_says_why(
    cluster_env: None, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.slurm.plugins")
    slurm = cluster("off")
    settings = slurm_settings(slurm, sqlite_url, plugin_check_interval=0.5)
    with TestClient(create_app(settings)) as api:
        register_nodes(api)
        ready = wait_until(
            lambda: (
                (r := api.get("/readyz").json())["status"] == "degraded"
                and PLUGIN in r["checks"].get("slurm-plugins", "")
                and r
            ),
            timeout=30,
            what="/readyz degraded by the plugin check",
        )
        assert PLUGIN in ready["checks"]["slurm-plugins"]
        assert JOB_SUBMIT in ready["checks"]["slurm-plugins"]
        assert "loaded: none" in ready["checks"]["slurm-plugins"]
        refused = api.post("/v1/admissions", json=admission("u-off"))
        assert refused.status_code == 409, refused.text
        assert "cannot share nodes safely" in refused.json()["detail"]
        assert PLUGIN in refused.json()["detail"]
        assert plugins_ok(api) == "0.0"
        assert api.get("/v1/nodes/n1").json()["holdings"] == []  # nothing held
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, [r.getMessage() for r in errors]  # one line, not per check
        assert "refusing new admissions" in errors[0].getMessage()

        # The operator adds the plugin and restarts slurmctld: admissions resume.
        slurm = cluster("on")
        wait_until(
            lambda: api.get("/readyz").json()["status"] == "ok",
            timeout=120,  # a fresh slurmctld on busy cores: a bound, not a pace
            what="/readyz ok once the plugin is loaded",
        )
        assert plugins_ok(api) == "1.0"
        admitted = wait_until(
            lambda: (
                (r := api.post("/v1/admissions", json=admission("u-on"))).status_code in (200, 201)
                and r
            ),
            timeout=120,
            what="an admission once the plugin is loaded",
        )
        assert admitted.json()["holder"]["id"] == "u-on"
    messages = [r.getMessage() for r in caplog.records]
    assert any("node_features/k8s_resources loaded" in m for m in messages), messages


@pytest.mark.slurm
@pytest.mark.slow
def test_warn_mode_only_says_so(cluster_env: None, sqlite_url: str) -> None:
    slurm = cluster("off")
    settings = slurm_settings(slurm, sqlite_url, plugin_check="warn", plugin_check_interval=0.5)
    with TestClient(create_app(settings)) as api:
        register_nodes(api)
        wait_until(
            lambda: api.get("/readyz").json()["status"] == "degraded",
            timeout=30,
            what="/readyz degraded",
        )
        answer = api.post("/v1/admissions", json=admission("u-warn"))
        assert answer.status_code == 201, answer.text
