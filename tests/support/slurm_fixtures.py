"""pytest fixtures for the real Slurm cluster: started once per session, reused when up."""

from __future__ import annotations

import pytest

from tests.support.realenv import unavailable
from tests.support.slurm_cluster import SlurmCluster, cluster_sh


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    try:
        cluster_sh("up", timeout=900)
        return SlurmCluster.from_env()
    except Exception as exc:  # any failure to start means the cluster is unavailable
        unavailable("Slurm test cluster", str(exc))
