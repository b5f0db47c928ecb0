"""The real Slurm 24.11 cluster the other Slurm tests rely on."""

from __future__ import annotations

import httpx
import pytest

from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = pytest.mark.slurm


def test_nodes_are_idle_with_full_gres(slurm_cluster: SlurmCluster) -> None:
    for name in slurm_cluster.nodes:
        node = slurm_cluster.node(name)
        assert node["cpus"] == 16
        assert node["real_memory"] == 32000
        assert "k8scpu:16" in node["gres"]
    assert "gpu:4" in slurm_cluster.node("n3")["gres"]


def test_slurmrestd_requires_the_token(slurm_cluster: SlurmCluster) -> None:
    url = f"{slurm_cluster.url}/slurm/v0.0.41/nodes/"
    headers = {"X-SLURM-USER-NAME": slurm_cluster.user}
    assert (
        httpx.get(url, headers={**headers, "X-SLURM-USER-TOKEN": slurm_cluster.token}).status_code
        == 200
    )
    assert httpx.get(url, headers={**headers, "X-SLURM-USER-TOKEN": "garbage"}).status_code in (
        401,
        511,
    )


def test_a_job_runs_and_completes(slurm_cluster: SlurmCluster) -> None:
    job = slurm_cluster.sbatch(
        "-w", "n1", "-c", "2", "--mem=100", "--gres=k8scpu:2,k8smemory:100", "--wrap", "sleep 1"
    )
    wait_until(lambda: slurm_cluster.job_state(job) == "COMPLETED", 30, what=f"job {job} done")
