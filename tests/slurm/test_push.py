"""Ledger -> Slurm against the real cluster: admissions lower k8scpu/k8smemory/k8sgpu,
releases raise them, drift after reconfigure and restarts is repaired (issue tests 2, 3, 6)."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from tests.slurm.helpers import admit, events, gres, slurm_holdings
from tests.support.slurm_cluster import N3_GPUS, SlurmCluster, wait_until

pytestmark = pytest.mark.slurm


def test_admission_lowers_counts_and_release_lets_the_waiting_job_run(
    slurm_api: TestClient, slurm: SlurmCluster
) -> None:
    assert admit(slurm_api, "n1", "pod-a", "3500m", "4Gi").status_code == 201
    # 3500m rounds up to 4 CPUs; 4Gi is 4096 MB.
    assert gres(slurm, "n1") == {"k8scpu": 12, "k8smemory": 32000 - 4096, "k8sgpu": 0}
    extra = slurm.node("n1")["extra"]
    assert '"nodeledger_k8scpu":4,"nodeledger_k8smemory":4096,"nodeledger_k8sgpu":0' in extra

    big = slurm.sbatch("-w", "n1", "-c", "10", "--mem=1000", "--gres=k8scpu:10,k8smemory:1000",
                       "--wrap", "sleep 60")  # fmt: skip
    wait_until(lambda: slurm.job_state(big) == "RUNNING", 30, what="10-CPU job running")
    waiting = slurm.sbatch("-w", "n1", "-c", "4", "--mem=1000", "--gres=k8scpu:4,k8smemory:1000",
                           "--wrap", "sleep 60")  # fmt: skip
    time.sleep(2)
    assert slurm.job_state(waiting) == "PENDING"  # 12 - 10 < 4: waits, as Slurm does

    # A job larger than the node's current total waits for the pods (the jobs queue, on by
    # default: the test clusters run extra_constraints), where Slurm alone refuses it.
    larger = slurm.sbatch("-w", "n1", "-c", "14", "--gres=k8scpu:14", "--wrap", "true")
    wait_until(lambda: slurm.job(larger).get("state_reason") == "Constraints", 30,
               what="the larger job waiting")  # fmt: skip

    assert slurm_api.delete("/v1/admissions/pod-a").status_code == 200
    assert gres(slurm, "n1")["k8scpu"] == 16
    assert "nodeledger=" not in slurm.node("n1")["extra"]
    wait_until(lambda: slurm.job_state(waiting) == "RUNNING", 30, what="waiting job running")
    slurm.scancel(larger)


def test_admission_is_rejected_when_slurm_jobs_hold_the_cpus(
    slurm_api: TestClient, slurm: SlurmCluster
) -> None:
    job = slurm.sbatch("-w", "n2", "-c", "12", "--mem=1000", "--gres=k8scpu:12,k8smemory:1000",
                       "--wrap", "sleep 60")  # fmt: skip
    wait_until(lambda: slurm_holdings(slurm_api, "n2").get(job), 30, what="job in the ledger")
    rejected = admit(slurm_api, "n2", "pod-b", "6")
    assert rejected.status_code == 409
    assert "cpu" in rejected.json()["detail"]
    assert gres(slurm, "n2")["k8scpu"] == 16  # nothing pushed for a rejected pod


@pytest.mark.parametrize("disruption", ["reconfigure", "restart_ctld", "restart_slurmd"])
def test_counts_come_back_after_slurm_resets_them(
    slurm_api: TestClient, slurm: SlurmCluster, disruption: str
) -> None:
    assert admit(slurm_api, "n2", "pod-c", "5", "2Gi").status_code == 201
    assert gres(slurm, "n2")["k8scpu"] == 11
    if disruption == "restart_slurmd":
        slurm.restart_slurmd("n2")
    else:
        getattr(slurm, disruption)()
    back = time.monotonic()
    # Repaired by the sync's drift push, or already by node_features/k8s_resources at
    # re-registration (it applies the ledger's token in the node's extra field).
    wait_until(lambda: gres(slurm, "n2")["k8scpu"] == 11, 30, what="counts repaired")
    print(f"{disruption}: counts right {time.monotonic() - back:.2f}s after Slurm was back")


def test_counts_reset_behind_our_back_are_pushed_again_and_recorded(
    slurm_api: TestClient, slurm: SlurmCluster
) -> None:
    assert admit(slurm_api, "n1", "pod-d", "2", "1Gi").status_code == 201
    slurm.set_gres("n1", "k8scpu:16,k8smemory:32000")  # what a reconfigure without the plugin does
    wait_until(lambda: gres(slurm, "n1")["k8scpu"] == 14, 30, what="counts repaired")
    drift = wait_until(lambda: events(slurm_api, "n1", "slurm_drift"), 30, what="drift event")
    assert "k8scpu:14" in drift[0]["message"]


def test_gpu_pods_lower_k8sgpu(slurm_api: TestClient, slurm: SlurmCluster) -> None:
    assert admit(slurm_api, "gpu-1", "gpu-pod", "1", "1Gi", gpu=1).status_code == 201
    assert gres(slurm, "n3") == {"k8scpu": 15, "k8smemory": 32000 - 1024, "k8sgpu": 3}
    assert N3_GPUS in slurm.node("n3")["gres"]  # the real GPU GRES is kept as it was
    slurm_api.delete("/v1/admissions/gpu-pod")
    assert gres(slurm, "n3")["k8sgpu"] == 4
