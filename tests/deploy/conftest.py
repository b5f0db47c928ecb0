"""Fixtures of the deployed product: the cluster with real nodes, its Slurm and PostgreSQL,
the service's image loaded into the nodes, and the chart installed (tests.support.deploy)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.deploy import (
    NAMESPACE,
    RELEASE,
    Helm,
    Release,
    build_image,
    start_kube,
    start_postgres,
    start_slurm,
    stop_kube,
    stop_postgres,
    stop_slurm,
    values,
    write_values,
)
from tests.support.kube_cluster import KubeCluster
from tests.support.realenv import unavailable
from tests.support.slurm_cluster import SlurmCluster

# Module scope: the cluster with nodes, its Slurm and its PostgreSQL are stopped once the
# module's tests are done, so that they cost the rest of the suite nothing (a next run
# starts them again in under a minute: the builds are cached).


def _quietly(stop: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):  # the failure that matters is the start's
        stop()


@pytest.fixture(scope="module")
def deploy_kube() -> Iterator[KubeCluster]:
    try:
        kube = start_kube()
    except Exception as exc:  # any failure to start means the cluster is unavailable
        _quietly(stop_kube)  # nothing of a half-started cluster outlives the session
        unavailable("Kubernetes cluster with nodes", str(exc))
    yield kube
    stop_kube()


@pytest.fixture(scope="module")
def deploy_slurm() -> Iterator[SlurmCluster]:
    try:
        slurm = start_slurm()
    except Exception as exc:
        _quietly(stop_slurm)
        unavailable("Slurm cluster for the deployment", str(exc))
    yield slurm
    stop_slurm()


@pytest.fixture(scope="module")
def deploy_postgres() -> Iterator[str]:
    try:
        url = start_postgres()
    except Exception as exc:
        _quietly(stop_postgres)
        unavailable("PostgreSQL on the nodes' bridge", str(exc))
    yield url
    stop_postgres()


@pytest.fixture(scope="module")
def service_image(deploy_kube: KubeCluster) -> Path:
    """The service's image, built from the work tree and imported into every node."""
    try:
        archive = build_image()
    except Exception as exc:
        unavailable("the service's image (image/build.sh)", str(exc))
    deploy_kube.script("load-image", str(archive), timeout=600)
    return archive


@pytest.fixture(scope="module")
def release(
    deploy_kube: KubeCluster,
    deploy_slurm: SlurmCluster,
    deploy_postgres: str,
    service_image: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """The chart installed (`helm install --wait`) into a fresh namespace, uninstalled
    after the module unless a test already did (the cluster goes anyway)."""
    kube = deploy_kube
    helm = Helm.of(kube)
    kube.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", timeout=180)
    kube.kubectl("create", "namespace", NAMESPACE)
    kube.kubectl(
        "-n", NAMESPACE, "create", "secret", "generic", "slurm-jwt",
        f"--from-literal=token={deploy_slurm.token}",
    )  # fmt: skip
    deploy_slurm.reset()
    chart_values = values(deploy_postgres, deploy_slurm)
    path = write_values(tmp_path_factory.mktemp("values") / "values.json", chart_values)
    installed = Release.install(helm, kube, deploy_slurm, path, chart_values)
    yield installed
    if installed.installed():
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m")
