"""node_features/k8s_resources inside each real Slurm release: totals from the node's own
hardware, runtime count changes never drain a node, and a re-registration restores what
Kubernetes holds from the node's extra field."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from tests.support.slurm_cluster import N3_GPUS, SlurmCluster, wait_until

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


def boot_time(slurm: SlurmCluster) -> str:
    """When the answering slurmctld started."""
    match = re.search(r"^BOOT_TIME\s*=\s*(\S+)", slurm.run("scontrol", "show", "config"), re.M)
    return match.group(1) if match else ""


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


@pytest.mark.parametrize("disruption", ["restart_ctld", "reconfigure", "restart_slurmd"])
def test_runtime_count_changes_keep_every_job_submittable(
    slurm: SlurmCluster, disruption: str
) -> None:
    """slurmctld keeps a cluster-wide count per GRES that runtime updates adjust by
    "new - old". Counts set by a node_features plugin were never added to it, so from a
    fresh start lowering one node by exactly 2 CPUs wrapped it to NO_VAL64, and slurmctld
    then rejected every job ("Invalid Trackable RESource (TRES) specification")."""
    if disruption == "restart_slurmd":
        before = int(slurm.node("n3")["slurmd_start_time"]["number"])
        time.sleep(max(0.0, before + 1.1 - time.time()))
        slurm.restart_slurmd("n3")
        wait_until(lambda: registered_since(slurm, "n3", before), 20, what="re-registration")
    else:
        getattr(slurm, disruption)()
    # A pod: 1500m, 2Gi, 1 GPU.
    slurm.set_gres("n3", f"k8scpu:14,k8smemory:29952,k8sgpu:3,{N3_GPUS}")
    gpu_job = slurm.sbatch("-w", "n3", "-c", "4", "--mem=4000", "--gres=gpu:2", "--wrap", "true")
    assert "k8sgpu:2" in slurm.job(gpu_job)["tres_per_node"]
    assert slurm.sbatch("-w", "n1", "--wrap", "true")


@pytest.mark.parametrize("disruption", ["restart_slurmd", "restart_ctld", "reconfigure"])
def test_registration_keeps_what_kubernetes_holds(slurm: SlurmCluster, disruption: str) -> None:
    # What the service writes along with the lowered counts; no service runs here, so
    # only the plugin can restore them.
    slurm.run(
        "scontrol",
        "update",
        "nodename=n1",
        'extra={"site":"a","nodeledger_k8scpu":4,"nodeledger_k8smemory":8000,"nodeledger_k8sgpu":0}',
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
    assert slurm.node("n1")["extra"].startswith('{"site":"a",')


def test_slurmctld_start_never_hands_out_what_kubernetes_holds(slurm: SlurmCluster) -> None:
    """slurmctld restarts while n1's slurmd is down, after the service lowered n1's counts
    and wrote what Kubernetes holds into its extra field (one update, as the service does).
    Up to 24.11 the plugin sizes n1 from extra at start; from 25.11 (no plugin call at start)
    slurmctld restores the counts from its saved state. Either way n1 never shows more than
    Kubernetes leaves, before or after it registers."""
    slurm.run(
        "scontrol", "update", "nodename=n1",
        'extra={"nodeledger_k8scpu":6,"nodeledger_k8smemory":1000}',
        "gres=k8scpu:10,k8smemory:31000",
    )  # fmt: skip
    old_boot = boot_time(slurm)
    slurm.stop_slurmd("n1")
    # restart-ctld waits for every node, so it returns only after n1 is back (below).
    restart = slurm.script_in_background("restart-ctld")
    try:

        def new_slurmctld() -> bool:
            try:
                return boot_time(slurm) not in ("", old_boot)
            except RuntimeError:  # not answering yet
                return False

        wait_until(new_slurmctld, 30, interval=0.2, what="the new slurmctld")
        assert slurm.node("n1")["gres"] == "k8scpu:10,k8smemory:31000"  # n1 is still down
    finally:
        slurm.restart_slurmd("n1")
        assert restart.wait(90) == 0
    wait_until(lambda: healthy(slurm, "n1") and counts(slurm, "n1")["k8scpu"] == 10, 20,
               what="n1 registered with the same totals")  # fmt: skip


def test_running_jobs_are_not_subtracted_twice_at_registration(slurm: SlurmCluster) -> None:
    """Slurm's gres_node_feature() alone would leave total - allocated available after a
    re-registration, so a running job would block its CPUs twice."""
    first = slurm.sbatch("-w", "n1", "-c", "4", "--mem=100", "--wrap", "sleep 60")
    wait_until(lambda: slurm.job_state(first) == "RUNNING", 10, what="first job running")
    before = int(slurm.node("n1")["slurmd_start_time"]["number"])
    time.sleep(max(0.0, before + 1.1 - time.time()))
    slurm.restart_slurmd("n1")
    wait_until(lambda: registered_since(slurm, "n1", before), 20, what="re-registration")
    assert counts(slurm, "n1") == {"k8scpu": 16, "k8smemory": 32000}
    rest = slurm.sbatch("-w", "n1", "-c", "12", "--mem=100", "--wrap", "sleep 60")
    wait_until(lambda: slurm.job_state(rest) == "RUNNING", 10, what="the other 12 CPUs used")


def test_jobs_cannot_land_on_what_kubernetes_holds(slurm: SlurmCluster) -> None:
    slurm.set_gres("n1", "k8scpu:4,k8smemory:8000")  # Kubernetes holds 12 CPUs
    with pytest.raises(RuntimeError, match="not available"):
        slurm.sbatch("-w", "n1", "-c", "6", "--wrap", "sleep 30")  # plain sbatch, no --gres
    fits = slurm.sbatch("-w", "n1", "-c", "4", "--mem=1000", "--wrap", "sleep 30")
    waits = slurm.sbatch("-w", "n1", "-c", "2", "--mem=1000", "--wrap", "sleep 30")
    wait_until(lambda: slurm.job_state(fits) == "RUNNING", 10, what="the job that fits runs")
    time.sleep(1)  # a scheduling pass or more: the second job must still wait
    assert slurm.job_state(waits) == "PENDING"
    assert slurm.job(waits)["state_reason"] == "Resources"
    assert slurm.node("n1")["alloc_cpus"] == 4  # never more than the 4 left to Slurm
