"""Two replicas: both serve, one leads (holds the Lease and runs the controllers); when
it stops, the other takes over without losing anything."""

from __future__ import annotations

import httpx
import pytest

from tests.kube.coloc import Coloc
from tests.support.kube_cluster import KubeCluster
from tests.support.net import free_port
from tests.support.service import ServiceProcess
from tests.support.slurm_cluster import wait_until

pytestmark = [pytest.mark.kube, pytest.mark.slurm]


def kube_health(url: str) -> str:
    return str(httpx.get(f"{url}/readyz", timeout=10).json()["checks"]["kubernetes"])


def lease_holder(kube: KubeCluster) -> str:
    lease = kube.get("lease", "nodeledger", "default") or {}
    return str((lease.get("spec") or {}).get("holderIdentity"))


def test_one_replica_leads_and_the_other_takes_over(env: tuple[Coloc, ServiceProcess]) -> None:
    coloc, first = env
    with coloc.replica("second", free_port()) as second:
        assert lease_holder(coloc.kube) == "nodeledger"  # the first replica's identity
        assert kube_health(first.url) == "leading"
        assert kube_health(second.url) == "standing by (another replica leads)"
        # Both serve the API from the same ledger.
        assert httpx.get(f"{second.url}/v1/nodes/kn1").json()["capacity"]["cpu"] == "16"

        first.process.terminate()  # the leader goes away and gives up its Lease
        first.process.wait(15)
        wait_until(lambda: lease_holder(coloc.kube) == "second", 20, what="second leads")
        wait_until(
            lambda: kube_health(second.url) == "leading", 20, what="second runs the controllers"
        )
        uid = coloc.pod("after", "1", "1Gi", scheduler="default-scheduler", node="kn2")
        wait_until(
            lambda: (
                uid in {h["holder"]["id"] for h in httpx.get(f"{second.url}/v1/holdings").json()}
            ),
            10,
            what="pod counted by the new leader",
        )
