"""Jobs already queued when the ledger lowers a node's k8s totals, on the real clusters.

A count pushed to 0 is dropped from the node's GRES string by Slurm; a job queued before,
asking for that GRES, must still not start on what pods hold. Measured: once the jobs
running there end, slurmctld evaluates the queued job against the lowered total and marks
it non-runnable (PENDING, Reason=BadConstraints, priority 0). That holds through a
reconfigure, a slurmctld restart and a slurmd restart in between (with the plugins, the
node_features plugin restores the lowered totals from ``extra`` at each registration).

BadConstraints is sticky in slurmctld: it evaluates such a job again only when node
features change or the job is updated (job_mgr.c), not when the totals come back. Once a
total rises, the sync's leader updates such jobs (app.slurm.held_back), and the job starts
once the pods leave: the last test. With the jobs queue (the service's default) a job has
an extra constraint and slurmctld keeps it waiting ``Constraints`` instead, tested again at
every pass: the last test too.

The order matters and is the service's: a lowered count lands (and is read back) before a
pod is admitted, so always before the job that used those resources ends. (An earlier
measurement that cancelled the running job *before* pushing 0 saw the queued job start in
between and took it for a hole: docs/slurm.md.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from tests.slurm.helpers import admit
from tests.support.slurm_cluster import N3_GPUS, SlurmCluster, wait_until

pytestmark = pytest.mark.slurm


def reason(slurm: SlurmCluster, job: str) -> str:
    return str(slurm.job(job)["state_reason"])


def held_back(slurm: SlurmCluster, job: str, why: str = "BadConstraints") -> bool:
    """Evaluated and kept pending for ``why``; fails the test at once if the job started."""
    state = slurm.job_state(job)
    assert state == "PENDING", f"job {job} is {state}: it started on what pods hold"
    return reason(slurm, job) == why


# Per kind: the node, its GRES with one unit of the k8s count left, the same with that
# count at 0 (Slurm drops it), what Kubernetes holds then (the ``extra`` keys the plugin
# reads at registration), and a job that takes the last unit.
KINDS = {
    "cpu": (
        "n1",
        "k8scpu:2,k8smemory:32000",
        "k8smemory:32000",
        '{"nodeledger_k8scpu":16,"nodeledger_k8smemory":0,"nodeledger_k8sgpu":0}',
        ["-c", "2", "--mem=500"],
    ),
    "gpu": (
        "n3",
        f"k8scpu:16,k8smemory:32000,k8sgpu:1,{N3_GPUS}",
        f"k8scpu:16,k8smemory:32000,{N3_GPUS}",
        '{"nodeledger_k8scpu":0,"nodeledger_k8smemory":0,"nodeledger_k8sgpu":4}',
        ["-c", "1", "--mem=500", "--gres=gpu:1"],
    ),
}
DISRUPTIONS: dict[str, Callable[[SlurmCluster, str], None]] = {
    "none": lambda slurm, node: None,
    "reconfigure": lambda slurm, node: slurm.reconfigure(),
    "restart-ctld": lambda slurm, node: slurm.restart_ctld(),
    "restart-slurmd": lambda slurm, node: slurm.restart_slurmd(node),
}


@pytest.mark.parametrize(
    ("kind", "disruption"),
    [("cpu", "none"), ("cpu", "reconfigure"), ("cpu", "restart-ctld"), ("gpu", "none"),
     ("gpu", "restart-slurmd")],
)  # fmt: skip
def test_a_count_of_zero_keeps_a_queued_job_from_starting(
    slurm: SlurmCluster, kind: str, disruption: str
) -> None:
    node, one_left, none_left, extra, job = KINDS[kind]
    slurm.rest("POST", f"node/{node}", json={"gres": one_left}).raise_for_status()
    running = slurm.sbatch("-w", node, *job, "--wrap", "sleep 600")
    queued = slurm.sbatch("-w", node, *job, "--wrap", "sleep 600")
    wait_until(lambda: slurm.job_state(running) == "RUNNING", 30, what="first job running")
    wait_until(lambda: reason(slurm, queued) == "Resources", 30, what="second one queued")

    # As the service pushes a pod that takes the rest (REST, counts and extra together).
    push = {"gres": none_left, "extra": extra}
    slurm.rest("POST", f"node/{node}", json=push).raise_for_status()
    DISRUPTIONS[disruption](slurm, node)
    assert f"k8s{kind}" not in slurm.node(node)["gres"]  # still 0, so dropped

    slurm.scancel(running)
    wait_until(lambda: held_back(slurm, queued), 120, what="queued job evaluated, held back")
    assert slurm.job_state(queued) == "PENDING"


def test_a_job_held_back_by_pods_starts_when_they_leave(
    queue_api: TestClient, slurm: SlurmCluster, request: pytest.FixtureRequest
) -> None:
    """A job queued behind another asks for 10 of n1's 16 CPUs; a pod takes 8 (k8scpu total
    8). When the first job ends, slurmctld holds the queued one back: the pod holds those
    CPUs (BadConstraints; with the jobs queue, Constraints). Once the pod leaves, it runs
    (without the queue, because the service has slurmctld evaluate it again)."""
    slurm_api = queue_api
    why = "Constraints" if request.node.callspec.params["queue_api"] else "BadConstraints"
    first = slurm.sbatch("-w", "n1", "-c", "8", "--mem=1000", "--wrap", "sleep 600")
    wait_until(lambda: slurm.job_state(first) == "RUNNING", 30, what="first job running")
    queued = slurm.sbatch("-w", "n1", "-c", "10", "--mem=1000", "--wrap", "sleep 600")
    wait_until(lambda: reason(slurm, queued) == "Resources", 30, what="queued behind it")
    assert admit(slurm_api, "n1", "pod-1", "8").status_code == 201
    assert slurm.k8s_counts("n1")["k8scpu"] == 8

    slurm.scancel(first)
    wait_until(lambda: held_back(slurm, queued, why), 120, what=f"queued job held back: {why}")

    assert slurm_api.delete("/v1/admissions/pod-1").status_code == 200
    wait_until(lambda: slurm.job_state(queued) == "RUNNING", 120, what="the job running")
