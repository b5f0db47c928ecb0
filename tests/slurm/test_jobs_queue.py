"""Jobs queue behind what pods hold instead of failing at submit (issue 31, item 1), on
the real clusters.

With ``NODELEDGER_SLURM_JOBS_QUEUE`` the service marks every node's Extra (a JSON object
with ``"nodeledger": 1`` and what pods hold), and the job_submit plugin gives each job the
extra constraint ``nodeledger=1`` when every node it may run on is marked. slurmctld
(``SchedulerParameters=extra_constraints``, as the test clusters run) then keeps a job
that asks for more k8s GRES than any node's current total pending, ``Reason=Constraints``,
and starts it once the pods go, instead of refusing it at submit.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.slurm.helpers import admit
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import marked, register_nodes, slurm_settings

pytestmark = pytest.mark.slurm


def reason(slurm: SlurmCluster, job: str) -> str:
    return slurm.run("squeue", "-h", "-j", job, "-o", "%r").strip()


def test_a_job_larger_than_what_pods_leave_waits_for_them(
    queue_api: TestClient, slurm: SlurmCluster, request: pytest.FixtureRequest
) -> None:
    queue = request.node.callspec.params["queue_api"]
    for uid in ("web-1", "web-2"):
        response = admit(queue_api, "n1", uid, "6", "2Gi")
        assert response.status_code == 201, response.text
    assert slurm.k8s_counts("n1")["k8scpu"] == 4
    big = ("-w", "n1", "-c", "8", "--mem=500", "--wrap", "sleep 600")
    if not queue:  # Slurm's own answer without the marks: refused at submit
        with pytest.raises(RuntimeError, match="Requested node configuration is not available"):
            slurm.sbatch(*big)
        assert not marked(slurm)
        return
    wait_until(lambda: marked(slurm), 60, what="every node of the partition marked")
    extra = str(slurm.node("n1")["extra"])
    assert '"nodeledger_k8scpu":12' in extra, extra
    job = slurm.sbatch(*big)
    wait_until(lambda: reason(slurm, job) == "Constraints", 60, what="the job waiting")
    # What the node can never give is still refused at submit: only pods' share waits.
    with pytest.raises(RuntimeError, match="Requested node configuration is not available"):
        slurm.sbatch("-w", "n1", "-c", "17", "--mem=500", "--wrap", "sleep 600")
    assert slurm.job(job)["extra"] == "nodeledger=1"
    # A restart of slurmctld, or a reconfigure, keeps it waiting: the counts come back lowered.
    for disrupt in (slurm.restart_ctld, slurm.reconfigure):
        disrupt()
        wait_until(lambda: slurm.k8s_counts("n1")["k8scpu"] == 4, 60, what="k8scpu 4 again")
        assert slurm.job_state(job) == "PENDING"
        assert reason(slurm, job) == "Constraints"
    assert queue_api.delete("/v1/admissions/web-1").status_code == 200
    wait_until(lambda: slurm.job_state(job) == "RUNNING", 60, what="the job running")
    assert queue_api.delete("/v1/admissions/web-2").status_code == 200
    slurm.scancel(job)


def test_a_users_own_extra_constraint_is_left_alone(
    queue_api: TestClient, slurm: SlurmCluster, request: pytest.FixtureRequest
) -> None:
    if request.node.callspec.params["queue_api"]:
        wait_until(lambda: marked(slurm), 60, what="every node marked")
    job = slurm.sbatch("-w", "n2", "--extra=nodeledger_k8scpu<=16", "--wrap", "sleep 600")
    assert slurm.job(job)["extra"] == "nodeledger_k8scpu<=16"
    slurm.scancel(job)


def test_turning_the_queue_off_strands_no_job(slurm: SlurmCluster, sqlite_url: str) -> None:
    """A job given the constraint while the queue was on still starts once the pods go
    after the service restarts with the queue off: the marker stays while it pends."""
    with TestClient(create_app(slurm_settings(slurm, sqlite_url))) as api:
        register_nodes(api, slurm)
        for uid in ("web-1", "web-2"):
            assert admit(api, "n1", uid, "6", "2Gi").status_code == 201
        job = slurm.sbatch("-w", "n1", "-c", "8", "--mem=500", "--wrap", "sleep 600")
        wait_until(lambda: reason(slurm, job) == "Constraints", 60, what="the job waiting")
    try:
        with TestClient(create_app(slurm_settings(slurm, sqlite_url, jobs_queue=False))) as api:
            for uid in ("web-1", "web-2"):
                assert api.delete(f"/v1/admissions/{uid}").status_code == 200
            wait_until(lambda: slurm.job_state(job) == "RUNNING", 60, what="the job running")
    finally:
        slurm.scancel(job)
