"""pytest fixtures for the real Kubernetes control plane (etcd, kube-apiserver,
kube-scheduler; no kubelet): started once per session and Kubernetes minor, reused when
already up."""

from __future__ import annotations

import pytest

from tests.support.kube_cluster import KUBE_NEWEST, KUBE_VERSIONS, KubeCluster, cluster_sh, kube_env
from tests.support.realenv import newest, unavailable
from tests.support.slurm_cluster import SLURM_VERSIONS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked kube_api (it crosses the parts of the API a release may change) runs on
    every minor of KUBE_VERSIONS, any other test that uses the control plane on the newest."""
    if "kube_cluster" not in metafunc.fixturenames:
        return
    every = metafunc.definition.get_closest_marker("kube_api") is not None
    metafunc.parametrize(
        "kube_cluster",
        KUBE_VERSIONS if every else (KUBE_NEWEST,),
        indirect=True,
        scope="session",
        ids=lambda v: f"kube-{v}",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an older minor a kube_api test that also crosses Slurm runs with the newest Slurm
    release only: the Kubernetes API does not change with Slurm's, and the pairs add minutes
    to a run that must fit CI's 90 minutes cold. One worker runs each older minor's tests
    (`--dist loadgroup`), so that its control plane runs once, not once per worker."""
    newest_slurm = newest(SLURM_VERSIONS)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        older_kube = params.get("kube_cluster", KUBE_NEWEST) != KUBE_NEWEST
        other_slurm = params.get("slurm_cluster", newest_slurm) != newest_slurm
        if older_kube:
            item.add_marker(pytest.mark.xdist_group(f"kube-{params['kube_cluster']}"))
        (drop if older_kube and other_slurm else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest) -> KubeCluster:
    version: str = request.param
    try:
        cluster_sh("up", timeout=1800, env=kube_env(version))  # a cold build takes minutes
        return KubeCluster.from_env(kube_env(version))
    except Exception as exc:  # any failure to start means the control plane is unavailable
        unavailable(f"Kubernetes {version} control plane", str(exc))
