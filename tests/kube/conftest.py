"""The co-location environment fixture shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.coloc import Coloc, coloc_env
from tests.support.helm import Helm, helm_for
from tests.support.kube_cluster import KUBE_NEWEST, KubeCluster
from tests.support.service import ServiceProcess
from tests.support.slurm_cluster import SlurmCluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A module run through both scheduler configurations (test_e2e.py) takes the
    placeholder one on the newest Kubernetes minor only: the scheduling it tests does not
    change between minors, and the placeholders' own API calls are tested on every minor
    (test_placeholders.py); the pairs would add minutes to CI's 90."""
    drop = [
        item
        for item in items
        if (params := getattr(getattr(item, "callspec", None), "params", {})).get("placeholders")
        and params.get("kube_cluster", KUBE_NEWEST) != KUBE_NEWEST
        and item.path.name == "test_e2e.py"
    ]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item not in drop]


@pytest.fixture
def placeholders() -> bool:
    """Whether the scheduler runs with placeholder pods (a module overrides this fixture
    with both values to run its tests through both paths)."""
    return False


@pytest.fixture
def env(
    kube_cluster: KubeCluster,
    slurm: SlurmCluster,
    sqlite_url: str,
    tmp_path: Path,
    placeholders: bool,
) -> Iterator[tuple[Coloc, ServiceProcess]]:
    """Control plane + Slurm + nodes + `nodeledger serve` + the extender scheduler."""
    with coloc_env(kube_cluster, slurm, sqlite_url, tmp_path, placeholders=placeholders) as both:
        yield both


@pytest.fixture(scope="module")
def helm(kube_cluster: KubeCluster) -> Helm:
    """helm for the chart's tests, rendering for the module's control plane."""
    return helm_for(kube_cluster)
