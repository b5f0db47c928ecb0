"""Fixtures shared by the GPU tests on real parts: node gpu-1 with four devices published
through DRA (``dra_node``) and a slurmrestd client (``client``). The `nodeledger serve`
they run, and what else they share with the benches, is in tests/support/gpu.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.slurm.client import SlurmClient
from app.slurm.tokens import FileToken
from tests.support.gpu import DraNode, dra_gpu_node
from tests.support.kube_cluster import KubeCluster
from tests.support.slurm_cluster import SlurmCluster


@pytest.fixture
def dra_node(kube_cluster: KubeCluster) -> Iterator[DraNode]:
    with dra_gpu_node(kube_cluster) as node:
        yield node


@pytest.fixture
def client(slurm: SlurmCluster) -> Iterator[SlurmClient]:
    """A client of the Slurm cluster's slurmrestd, as SlurmUser."""
    client = SlurmClient(slurm.url, FileToken(slurm.token_file), user_name=slurm.user)
    yield client
    client.close()
