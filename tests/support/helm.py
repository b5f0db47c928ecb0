"""helm against the test control plane, and the chart it installs (charts/nodeledger)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.kube_cluster import KubeCluster, cluster_sh
from tests.support.realenv import REPO

CHART = Path(REPO) / "charts" / "nodeledger"


@dataclass(frozen=True)
class Helm:
    path: str
    kube_version: str  # what `helm template --kube-version` renders for: the cluster's


def helm_for(kube: KubeCluster) -> Helm:
    """The helm testenv/kube/cluster.sh installed, rendering for ``kube``'s release."""
    env = dict(re.findall(r"^export (\w+)=(.*)$", cluster_sh("env"), re.MULTILINE))
    return Helm(env["HELM"], kube.version)


def run(helm: Helm, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [helm.path, *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}: {result.stderr}")
    return result
