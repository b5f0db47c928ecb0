"""The gate and the headroom's grant at a k8s count of 0, on the real clusters.

Slurm leaves a GRES whose total is 0 out of the node's ``gres`` and ``gres_used`` alike,
though it still counts what its jobs use of it (a job's k8scpu:2 vanished from GresUsed
at a k8scpu total of 0 and came back at 16, 26.05.3). So a push that takes the last unit
cannot read the jobs' use back from the node: it reads a job listing made after it
(app.core.counts.slurm_usage). Before that, a pod that took a whole node beside a job the
ledger had not listed yet was confirmed (the disruption race of test_headroom_disruptions
saw 2 CPUs of jobs beside 15 of pods).

The sync runs every 30 s here, so the ledger has not listed the job when the pod comes:
only the gate's read-back stands between them. With and without a headroom.
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
HEADROOM = {"headroom_cpu": "2", "headroom_memory": "4Gi", "headroom_gpu": 1}


@pytest.fixture(params=["no headroom", "headroom"])
def api(
    request: pytest.FixtureRequest, slurm: SlurmCluster, sqlite_url: str
) -> Iterator[TestClient]:
    extra = HEADROOM if request.param == "headroom" else {}
    settings = slurm_settings(slurm, sqlite_url, sync_interval=30, **extra)
    with TestClient(create_app(settings)) as client:
        register_nodes(client)  # not marked until a sync step: jobs get no constraint
        yield client


# Per kind: the ledger's node (n3 is "gpu-1" to the ledger), the Slurm node, the job, the
# pod that would take the whole node beside it and the pod that takes what the job leaves:
# (cpu, memory, gpus).
KINDS = {
    "cpu": ("n1", "n1", ["-c", "2", "--mem=500"], ("16", "1Gi", 0), ("14", "1Gi", 0)),
    "gpu": (
        "gpu-1",
        "n3",
        ["-c", "1", "--mem=500", "--gres=gpu:1"],
        ("1", "1Gi", 4),
        ("1", "1Gi", 3),
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_pod_that_takes_the_last_unit_still_sees_the_job_using_it(
    api: TestClient, slurm: SlurmCluster, kind: str
) -> None:
    node, slurm_node, job_args, whole, rest = KINDS[kind]
    job = slurm.sbatch("-w", slurm_node, *job_args, "--wrap", "sleep 600")
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 30, what="the job running")
    refused = admit(api, node, "whole", *whole)
    assert refused.status_code == 409, refused.text
    assert "Slurm already holds it" in refused.json()["detail"]
    admitted = admit(api, node, "rest", *rest)
    assert admitted.status_code == 201, admitted.text
    assert slurm.job_state(job) == "RUNNING"
    slurm.scancel(job)
