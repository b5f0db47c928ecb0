"""pytest fixtures for the real Kubernetes control plane (etcd, kube-apiserver,
kube-scheduler; no kubelet): started once per session, reused when already up."""

from __future__ import annotations

import pytest

from tests.support.kube_cluster import KubeCluster, cluster_sh
from tests.support.realenv import unavailable


@pytest.fixture(scope="session")
def kube_cluster() -> KubeCluster:
    try:
        cluster_sh("up", timeout=1800)  # a cold build of the binaries takes minutes
        return KubeCluster.from_env()
    except Exception as exc:  # any failure to start means the control plane is unavailable
        unavailable("Kubernetes control plane", str(exc))
