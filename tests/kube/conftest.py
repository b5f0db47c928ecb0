"""The co-location environment fixture shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.coloc import Coloc, coloc_env
from tests.support.kube_cluster import KubeCluster
from tests.support.service import ServiceProcess
from tests.support.slurm_cluster import SlurmCluster


@pytest.fixture
def env(
    kube_cluster: KubeCluster, slurm: SlurmCluster, sqlite_url: str, tmp_path: Path
) -> Iterator[tuple[Coloc, ServiceProcess]]:
    """Control plane + Slurm + nodes + `nodeledger serve` + the extender scheduler."""
    with coloc_env(kube_cluster, slurm, sqlite_url, tmp_path) as both:
        yield both
