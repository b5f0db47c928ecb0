"""Fixtures of the deployed product: the cluster with real nodes, its Slurm and PostgreSQL,
the service's image loaded into the nodes, and the chart installed (tests.support.deploy)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
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
from tests.support.slurm_cluster import SLURM_VERSIONS, SlurmCluster

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


# Every release the suite runs a cluster of, the newest first; one at a time (the same
# ports): the chart is installed afresh against each, on the same Kubernetes nodes.
DEPLOY_SLURM_VERSIONS = sorted(SLURM_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))[::-1]


@pytest.fixture(scope="module", params=DEPLOY_SLURM_VERSIONS)
def deploy_slurm(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    version: str = request.param
    try:
        slurm = start_slurm(version)
    except Exception as exc:
        _quietly(partial(stop_slurm, version))
        unavailable(f"Slurm {version} cluster for the deployment", str(exc))
    yield slurm
    stop_slurm(version)


@pytest.fixture(scope="module")
def deploy_postgres(deploy_slurm: SlurmCluster) -> Iterator[str]:
    """A new database per Slurm cluster: the second install starts from an empty ledger."""
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
