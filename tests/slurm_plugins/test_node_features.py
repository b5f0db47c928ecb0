"""node_features/k8s_resources inside the real Slurm 24.11: totals from the node's own
hardware, runtime count changes never drain a node, and a re-registration restores what
Kubernetes holds from the node's extra field; plus the C unit tests, under valgrind."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = pytest.mark.slurm
BAD_STATES = {"INVALID_REG", "INVALID", "DRAIN", "DOWN", "FAIL"}


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()


def counts(slurm: SlurmCluster, node: str) -> dict[str, int]:
    return {k: v for k, v in slurm.k8s_counts(node).items() if v or k != "k8sgpu"}


def healthy(slurm: SlurmCluster, node: str) -> bool:
    states = set(slurm.node(node)["state"])
    assert not states & BAD_STATES, f"{node} is {states}: {slurm.node(node)['reason']}"
    return True


def registered_since(slurm: SlurmCluster, node: str, started: int) -> bool:
    return int(slurm.node(node)["slurmd_start_time"]["number"]) > started


def test_c_unit_tests_pass_under_valgrind(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("make", "-s", "-C", "/usr/src/nodeledger-plugins", "check-valgrind")
    assert "0 failures" in out


def test_totals_come_from_the_nodes_hardware_not_slurm_conf(slurm: SlurmCluster) -> None:
    # The token file lives in <chroot>/srv/run/.
    slurm_conf = (slurm.token_file.parents[2] / "etc/slurm/slurm.conf").read_text()
    assert "k8scpu:" not in slurm_conf  # no per-node Gres=k8s... entries
    assert counts(slurm, "n1") == {"k8scpu": 16, "k8smemory": 32000}
    assert counts(slurm, "n3") == {"k8scpu": 16, "k8smemory": 32000, "k8sgpu": 4}


@pytest.mark.parametrize("gres", ["k8scpu:24,k8smemory:40000", "k8scpu:3,k8smemory:1000"])
def test_runtime_counts_never_drain_the_node(slurm: SlurmCluster, gres: str) -> None:
    slurm.set_gres("n2", gres)
    before = int(slurm.node("n2")["slurmd_start_time"]["number"])
    # The start time has second resolution (and reconfigure may just have restarted slurmd):
    # restart in a later second so the new registration is visible.
    time.sleep(max(0.0, before + 1.1 - time.time()))
    slurm.restart_slurmd("n2")
    wait_until(lambda: registered_since(slurm, "n2", before), 20, what="re-registration")
    wait_until(lambda: counts(slurm, "n2")["k8scpu"] == 16, 10, what="totals from hardware")
    assert healthy(slurm, "n2")
    slurm.set_gres("n2", gres)
    slurm.reconfigure()
    wait_until(lambda: counts(slurm, "n2")["k8scpu"] == 16, 20, what="totals after reconfigure")
    assert healthy(slurm, "n2")


@pytest.mark.parametrize("disruption", ["restart_slurmd", "restart_ctld", "reconfigure"])
def test_registration_keeps_what_kubernetes_holds(slurm: SlurmCluster, disruption: str) -> None:
    # What the service writes along with the lowered counts; no service runs here, so
    # only the plugin can restore them.
    slurm.run(
        "scontrol",
        "update",
        "nodename=n1",
        "extra=site=a nodeledger=k8scpu:4,k8smemory:8000,k8sgpu:0",
    )
    # Full counts, as a slurmctld restart without the plugin would leave them: only the
    # plugin's registration hook can bring them down to what Kubernetes leaves.
    slurm.set_gres("n1", "k8scpu:16,k8smemory:32000")
    if disruption == "restart_slurmd":
        slurm.restart_slurmd("n1")
    else:
        getattr(slurm, disruption)()
    lowered = {"k8scpu": 12, "k8smemory": 24000}
    wait_until(lambda: healthy(slurm, "n1") and counts(slurm, "n1") == lowered, 20, what="counts")
    assert slurm.node("n1")["extra"].startswith("site=a ")


def test_jobs_cannot_land_on_what_kubernetes_holds(slurm: SlurmCluster) -> None:
    slurm.set_gres("n1", "k8scpu:4,k8smemory:8000")  # Kubernetes holds 12 CPUs
    with pytest.raises(RuntimeError, match="not available"):
        slurm.sbatch("-w", "n1", "-c", "6", "--wrap", "sleep 30")  # plain sbatch, no --gres
    fits = slurm.sbatch("-w", "n1", "-c", "4", "--mem=1000", "--wrap", "sleep 30")
    waits = slurm.sbatch("-w", "n1", "-c", "2", "--mem=1000", "--wrap", "sleep 30")
    wait_until(lambda: slurm.job_state(fits) == "RUNNING", 10, what="the job that fits runs")
    assert slurm.job_state(waits) == "PENDING"
    assert slurm.node("n1")["alloc_cpus"] in (0, 4)  # never more than the 4 left to Slurm
