"""Slurm shows who holds what the k8s counts withhold (issue 31, item 3), on the real
clusters: a job that waits for what pods hold, and the node's comment naming them.

The push writes the node's ``comment`` in the same update as the counts
(app.core.slurm_comment), so an administrator reading ``scontrol show node`` for a job
that pends with ``Reason=Resources`` finds the pods; a comment an administrator wrote is
left alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.slurm.helpers import admit
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import register_nodes, slurm_settings

pytestmark = pytest.mark.slurm


@pytest.fixture
def api(slurm: SlurmCluster, sqlite_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(slurm_settings(slurm, sqlite_url))) as client:
        register_nodes(client, slurm)
        yield client


def comment(slurm: SlurmCluster, node: str) -> str:
    return str(slurm.node(node).get("comment") or "")


def reason(slurm: SlurmCluster, job: str) -> str:
    return slurm.run("squeue", "-h", "-j", job, "-o", "%r").strip()


def test_a_waiting_job_finds_the_pods_it_waits_for_on_the_node(
    api: TestClient, slurm: SlurmCluster
) -> None:
    for uid in ("web-1", "web-2"):
        assert admit(api, "n1", uid, "6", "2Gi").status_code == 201
    assert comment(slurm, "n1") == (
        "nodeledger: k8s withholds cpu=12 mem=4096M: pods default/web-1 default/web-2"
    )
    # The pods leave 4 CPUs: a 2-CPU job runs, and a 4-CPU job waits for the pods.
    first = slurm.sbatch("-w", "n1", "-c", "2", "--mem=500", "--wrap", "sleep 600")
    wait_until(lambda: slurm.job_state(first) == "RUNNING", 30, what="the first job running")
    job = slurm.sbatch("-w", "n1", "-c", "4", "--mem=500", "--wrap", "sleep 600")
    wait_until(lambda: reason(slurm, job) == "Resources", 60, what="the job waiting")
    assert api.delete("/v1/admissions/web-1").status_code == 200
    assert comment(slurm, "n1") == "nodeledger: k8s withholds cpu=6 mem=2048M: pods default/web-2"
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 60, what="the job running")
    assert api.delete("/v1/admissions/web-2").status_code == 200
    assert comment(slurm, "n1") == ""
    slurm.scancel(first)
    slurm.scancel(job)


def test_an_administrators_comment_is_left_alone(api: TestClient, slurm: SlurmCluster) -> None:
    """Written after the service's last push (the jobs queue's marks): the next push reads
    the node before it writes, so the comment and the site's own Extra key stay."""
    slurm.run("scontrol", "update", "nodename=n2", "comment=rack 7, PSU swapped")
    slurm.run("scontrol", "update", "nodename=n2", 'extra={"nodeledger":1,"rack":7}')
    assert admit(api, "n2", "web-1", "2").status_code == 201
    assert slurm.k8s_counts("n2")["k8scpu"] == 14  # the counts went, the comment stayed
    assert comment(slurm, "n2") == "rack 7, PSU swapped"
    assert slurm.node("n2")["extra"].startswith('{"rack":7,"nodeledger":1,'), slurm.node("n2")
