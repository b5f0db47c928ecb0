"""A slurmctld start never hands Slurm's jobs what pods hold, however slurmctld stopped
(issue 48), on the real clusters, with each of the service's features that change what it
asks Slurm.

slurmctld saves its state in the background, at most every 5 s. A pod admitted through
Slurm just after a save, then slurmctld killed with -9: slurmctld comes back with the counts
and ``extra`` from before the admission (measured on both releases: k8scpu 16 under the
pod's 4 CPUs, and a 14-CPU job ran beside it). The node_features plugin fences every node
the ledger keeps at 0 until the service sets its counts again; a 14-CPU job released as
slurmctld answers never runs beside the pod.
"""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from tests.slurm.helpers import admit
from tests.support.slurm_cluster import SlurmCluster, wait_until
from tests.support.slurm_fixtures import FEATURES, service_with_nodes, slurm_settings
from tests.support.slurm_race import slurm_use

pytestmark = pytest.mark.slurm
NODE = "n1"
POD_CPUS = 4


def saved_at(slurm: SlurmCluster, name: str) -> float:
    """When slurmctld last saved one of its state files (0: being replaced right now)."""
    assert slurm.chroot is not None
    try:
        return (slurm.chroot / "srv/run/state" / name).stat().st_mtime
    except FileNotFoundError:
        return 0.0


def pods_cpus(api: TestClient) -> int:
    return -(-int(api.get(f"/v1/nodes/{NODE}").json()["held_by_kubernetes"]["cpu_millis"]) // 1000)


def admitted_unsaved(api: TestClient, slurm: SlurmCluster, submitted: float) -> bool:
    """The pod admitted through Slurm right after slurmctld saved its state, so that its push
    is not saved yet: a job's submission (at ``submitted``) makes slurmctld save, and the
    next save comes at least 5 s later. False (the pod released) when one came between."""
    wait_until(lambda: saved_at(slurm, "job_state") > submitted, 30, what="the job saved")
    saved = time.time()
    response = admit(api, NODE, "p", str(POD_CPUS), "1Gi")
    assert response.status_code == 201, response.text
    if time.time() - saved < 4 and saved_at(slurm, "node_state") < saved:
        return True
    assert api.delete("/v1/admissions/p").status_code == 200
    return False


def fits(api: TestClient, slurm: SlurmCluster, seconds: float) -> None:
    """Jobs and the pod fit n1 at every sample for ``seconds``: Slurm starts a job the moment
    its counts allow, so a job that could take the pod's CPUs would show."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        jobs = slurm_use(slurm, NODE)[0]
        assert jobs + pods_cpus(api) <= 16, f"jobs {jobs} CPUs beside the pod's {POD_CPUS}"
        time.sleep(0.2)


@pytest.mark.parametrize("features", list(FEATURES))
def test_a_pod_admitted_just_before_slurmctld_is_killed_is_never_handed_to_jobs(
    slurm: SlurmCluster, sqlite_url: str, features: str
) -> None:
    # The sync every 30 s, so that only the plugin stands between the restart and the jobs
    # until the test hints the service (a hint a real slurmctld's watcher would send).
    settings = slurm_settings(slurm, sqlite_url, sync_interval=30, **FEATURES[features])
    job = ""
    with service_with_nodes(settings, slurm) as api:
        try:
            for _ in range(3):
                slurm.scancel(job)
                submitted = time.time()
                # Held: eligible only once slurmctld answers again, with the counts it has.
                job = slurm.sbatch("-H", "-w", NODE, "-c", "14", "--mem=500", "--wrap", "sleep 300")
                if admitted_unsaved(api, slurm, submitted):
                    break
            else:
                pytest.fail("slurmctld saved its state within 4 s of each of 3 saves")
            expected = slurm.k8s_counts(NODE)["k8scpu"]  # the pod's 4 (any headroom) withheld
            assert expected <= 16 - POD_CPUS
            slurm.kill_ctld()
            slurm.start_ctld()
            assert slurm.k8s_counts(NODE)["k8scpu"] in (0, expected)  # fenced, or pushed
            slurm.run("scontrol", "release", job)
            fits(api, slurm, 3)
            assert api.post("/v1/slurm/node-hints", json={"nodes": [NODE]}).status_code == 202
            wait_until(
                lambda: slurm.k8s_counts(NODE)["k8scpu"] == expected,
                60,
                what="the service's counts back in Slurm",
            )
            fits(api, slurm, 2)
            assert slurm.job_state(job) == "PENDING"
        finally:
            slurm.scancel(job)
