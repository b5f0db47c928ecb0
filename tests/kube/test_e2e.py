"""End to end: real kube-apiserver + real kube-scheduler (with the nodeledger extender) +
real Slurm + `nodeledger serve` (issue tests 1-6), each test through both of the chart's
scheduler configurations: the extender's filter, prioritize and bind, and placeholder pods
with the extender binding only (issue 35)."""

from __future__ import annotations

import json
import time

import pytest

from tests.kube.coloc import NODES, Coloc
from tests.support.service import ServiceProcess
from tests.support.slurm_cluster import wait_until

pytestmark = [pytest.mark.kube, pytest.mark.kube_api, pytest.mark.slurm]


@pytest.fixture(params=[False, True], ids=["extender", "placeholders"])
def placeholders(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def coloc(env: tuple[Coloc, ServiceProcess]) -> Coloc:
    return env[0]


def test_pods_land_only_where_slurm_left_room(coloc: Coloc) -> None:
    # A Slurm job fills n1 (Kubernetes node kn1).
    job = coloc.slurm.sbatch("-w", "n1", "-c", "16", "--mem=30000", "--wrap", "sleep 300")
    wait_until(
        lambda: coloc.ledger_node("kn1")["held_by_slurm"]["cpu"] == "16", 10, what="job in ledger"
    )
    for i in range(4):
        coloc.pod(f"p{i}", "3", "2Gi")
    nodes = {f"p{i}": coloc.kube.wait_bound(f"p{i}", timeout=20) for i in range(4)}
    assert "kn1" not in nodes.values()
    assert set(nodes.values()) <= {"kn2", "kn3"}
    # What Kubernetes holds is now withheld from Slurm on those nodes.
    held = {n: sum(3 for v in nodes.values() if v == n) for n in ("kn2", "kn3")}
    for name, cpus in held.items():
        assert coloc.gres(NODES[name])["k8scpu"] == 16 - cpus
    # Fits nowhere: stays Pending with the extender's reason (or kube-scheduler's own).
    coloc.pod("huge", "15", "2Gi")
    reason = wait_until(
        lambda: "insufficient" in coloc.events_for("huge").lower() and coloc.events_for("huge"),
        20,
        what="FailedScheduling",
    )
    assert "cpu" in reason
    assert coloc.kube.pod_node("huge") is None
    coloc.slurm.scancel(job)


def test_deleting_a_pod_frees_the_ledger_and_lets_the_waiting_slurm_job_run(coloc: Coloc) -> None:
    uid = coloc.pod("big", "8", "4Gi")
    slurm_node = NODES[coloc.kube.wait_bound("big", timeout=20)]
    assert coloc.gres(slurm_node)["k8scpu"] == 8
    running = coloc.slurm.sbatch("-w", slurm_node, "-c", "8", "--mem=1000", "--wrap", "sleep 60")
    waiting = coloc.slurm.sbatch("-w", slurm_node, "-c", "4", "--mem=1000", "--wrap", "sleep 60")
    wait_until(lambda: coloc.slurm.job_state(running) == "RUNNING", 10, what="first job running")
    time.sleep(2)
    assert coloc.slurm.job_state(waiting) == "PENDING"  # the pod holds the rest
    coloc.kube.delete_pod("big")
    wait_until(lambda: uid not in coloc.pod_holdings(), 10, what="holding released")
    assert coloc.gres(slurm_node)["k8scpu"] == 16
    wait_until(lambda: coloc.slurm.job_state(waiting) == "RUNNING", 30, what="waiting job runs")


def test_pods_bound_by_other_schedulers_are_counted(coloc: Coloc) -> None:
    plain = coloc.pod("plain", "2", "1Gi", scheduler="default-scheduler", node="kn2")
    # What the DaemonSet controller creates: bound at creation, owned by the DaemonSet.
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds-uid"}
    daemon = coloc.pod("agent-kn2", "500m", "256Mi", scheduler="default-scheduler",
                       node="kn2", owner={**owner, "controller": True})  # fmt: skip
    wait_until(lambda: {plain, daemon} <= set(coloc.pod_holdings()), 10, what="both counted")
    assert coloc.ledger_node("kn2")["held_by_kubernetes"]["cpu"] == "2500m"
    assert coloc.gres("n2")["k8scpu"] == 16 - 3  # 2.5 CPUs round up to 3
    coloc.kube.set_pod_phase("plain", "Succeeded")  # completion, simulated through the API
    wait_until(lambda: plain not in coloc.pod_holdings(), 10, what="finished pod released")
    assert coloc.gres("n2")["k8scpu"] == 15


def test_kubectl_get_genericnode_shows_both_sides(coloc: Coloc) -> None:
    coloc.pod("gpu-pod", "1500m", "2Gi", gpu=1)
    coloc.kube.wait_bound("gpu-pod", timeout=20)
    job = coloc.slurm.sbatch(
        "-w", "n3", "-c", "4", "--mem=4000", "--gres=gpu:2", "--wrap", "sleep 120"
    )
    wait_until(lambda: coloc.slurm.job_state(job) == "RUNNING", 10, what="job running")

    header = coloc.kube.kubectl("get", "gn").splitlines()[0].split()
    assert header == ["NAME", "CLUSTERNAME", "ALIAS", "TYPE", "K8S", "CPU", "K8S", "MEM", "SLURM",
                      "CPU", "SLURM", "MEM", "FREE", "CPU", "FREE", "MEM", "AGE"]  # fmt: skip
    # 16 CPUs - 1500m (pod) - 4 (job); 32000Mi - 2Gi - 4000Mi
    expected = ["lab", "n3", "Slurm", "1500m", "2Gi", "4", "4000Mi", "10500m", "25952Mi"]
    wait_until(
        lambda: (
            coloc.kube.kubectl("get", "gn", "kn3", "--no-headers", check=False).split()[1:10]
            == expected
        ),
        10,
        what=f"kubectl get gn kn3 shows {expected}",
    )
    wide = coloc.kube.kubectl("get", "gn", "kn3", "-o", "wide", "--no-headers").split()
    # GPUs, Ready, then the headroom's CPU, free CPU, memory, free memory (off here: 0).
    assert wide[-8:] == ["1", "2", "1", "Admissible", "0", "0", "0", "0"]


def bind_and_count_two_pods(coloc: Coloc) -> tuple[str, str]:
    """Pods "kept" (2 CPUs) and "gone" (3 CPUs), bound through the extender and counted."""
    kept = coloc.pod("kept", "2", "1Gi")
    gone = coloc.pod("gone", "3", "1Gi")
    for name in ("kept", "gone"):
        coloc.kube.wait_bound(name, timeout=20)
    wait_until(lambda: {kept, gone} <= set(coloc.pod_holdings()), 10, what="counted")
    return kept, gone


def assert_kubernetes_holds_3_cpus(coloc: Coloc) -> None:
    """In the ledger and in Slurm's counts: nothing lost, nothing counted twice."""
    held = sum(n["held_by_kubernetes"]["cpu_millis"] for n in coloc.get("/v1/nodes"))
    assert held == 3000
    # The Slurm counts follow the ledger, not what was pushed before.
    k8s_cpus = 16 * 3 - sum(coloc.gres(s)["k8scpu"] for s in NODES.values())
    assert k8s_cpus == 3


def test_service_restart_loses_nothing_and_counts_nothing_twice(
    env: tuple[Coloc, ServiceProcess],
) -> None:
    coloc, service = env
    kept, _ = bind_and_count_two_pods(coloc)
    service.process.terminate()
    assert service.process.wait(15) == 0  # stopped gracefully
    # The kubernetes client wrote the kubeconfig's inline credentials (a private key) to
    # files for its TLS; a stopped service leaves none behind.
    assert list(coloc.tmp_dir.iterdir()) == []
    # While the service is down: a pod goes, another is bound by another scheduler.
    coloc.kube.delete_pod("gone")
    new = coloc.pod("new", "1", "1Gi", scheduler="default-scheduler", node="kn1")
    with coloc.service("nodeledger-restarted"):
        wait_until(lambda: set(coloc.pod_holdings()) == {kept, new}, 15, what="resync converged")
        assert_kubernetes_holds_3_cpus(coloc)


def test_apiserver_restart_resumes_watches_and_counts_nothing_twice(
    env: tuple[Coloc, ServiceProcess],
) -> None:
    coloc, service = env
    kept, _ = bind_and_count_two_pods(coloc)
    coloc.kube.restart_apiserver()
    # Changes right after the restart must arrive through the resumed watches.
    coloc.kube.delete_pod("gone")
    new = coloc.pod("new", "1", "1Gi", scheduler="default-scheduler", node="kn1")
    wait_until(lambda: set(coloc.pod_holdings()) == {kept, new}, 30, what="watches resumed")
    assert_kubernetes_holds_3_cpus(coloc)
    assert service.process.poll() is None


def test_genericnode_admission_check_is_answered_within_a_second(coloc: Coloc) -> None:
    fits = {"cpu": "2", "memory": "1Gi"}
    requests = [
        {"podUID": "uid-fits", "namespace": "batch", "name": "fits", "requests": fits},
        {"podUID": "uid-huge", "namespace": "batch", "name": "huge", "requests": {"cpu": "40"}},
    ]
    asked = time.monotonic()
    coloc.kube.kubectl("patch", "genericnode", "kn2", "--type=merge", "-p",
                       json.dumps({"spec": {"admissionRequests": requests}}))  # fmt: skip

    def answers() -> dict[str, dict[str, str]]:
        obj = coloc.kube.get("genericnode", "kn2") or {}
        checks = (obj.get("status") or {}).get("admissionChecks") or []
        return {c["podUID"]: c for c in checks}

    checks = wait_until(
        lambda: len(answers()) == 2 and answers(), 60, interval=0.05, what="answers"
    )
    elapsed = time.monotonic() - asked
    assert checks["uid-fits"]["result"] == "Admitted"
    assert checks["uid-huge"]["result"] == "Rejected"
    assert "cpu" in checks["uid-huge"]["message"]
    assert coloc.gres("n2")["k8scpu"] == 14  # the admitted request is withheld from Slurm
    print(f"GenericNode admission check answered in {elapsed:.3f}s")
