"""One maintenance on both sides of a co-managed node (issue 34), end to end: real
kube-apiserver and default kube-scheduler, real Slurm, `nodeledger serve`.

An operator drains a co-managed node in Slurm: the Node gets the service's taint, so a pod
of any scheduler (here the default one) stays off it; a resume lifts that taint and no one
else's. Turned off, the service removes its own taints. An operator cordons the Node: the
Slurm node drains, so no job starts there; the uncordon resumes it, unless an
administrator's drain came meanwhile. With slurmrestd stopped, a cordon drains nothing and
counts as a disagreement; once slurmrestd answers again, the drain is applied.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from app.core.maintenance import REASON_ANNOTATION, TAINT_KEY
from tests.kube.coloc import Coloc
from tests.support.service import ServiceProcess
from tests.support.slurm_cluster import SlurmCluster, wait_until

pytestmark = [pytest.mark.kube, pytest.mark.slurm]
RACK = {"key": "example.com/rack", "value": "7", "effect": "NoSchedule"}


def node(coloc: Coloc, name: str) -> dict[str, Any]:
    found = coloc.kube.get("node", name)
    assert found is not None
    return found


def ours(coloc: Coloc, name: str) -> list[dict[str, Any]]:
    return [t for t in node(coloc, name)["spec"].get("taints") or () if t["key"] == TAINT_KEY]


def events(coloc: Coloc, node: str) -> list[str]:
    return [e["message"] for e in coloc.get("/v1/events", node=node, kind="maintenance")]


def unschedulable(coloc: Coloc, pod: str) -> bool:
    found = coloc.kube.get("pod", pod, "default")
    assert found is not None
    conditions = (found.get("status") or {}).get("conditions") or ()
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
    )


def pinned_pod(coloc: Coloc, name: str, slurm_node: str) -> None:
    """A pod of the default scheduler that only fits the Node of ``slurm_node``."""
    container = {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
    spec = {"nodeSelector": {"nodeledger.io/slurm-node": slurm_node}, "containers": [container]}
    coloc.kube.create(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
         "spec": spec}
    )  # fmt: skip


def test_a_slurm_drain_keeps_every_scheduler_off_the_node_and_a_resume_lifts_only_its_taint(
    env: tuple[Coloc, ServiceProcess],
) -> None:
    coloc, _ = env
    coloc.kube.kubectl("taint", "nodes", "kn1", "example.com/rack=7:NoSchedule")
    coloc.slurm.run("scontrol", "update", "nodename=n1", "state=drain", "reason=hw check")
    drained = [{"key": TAINT_KEY, "value": "DRAIN", "effect": "NoSchedule"}]
    wait_until(lambda: ours(coloc, "kn1") == drained, 60, what="kn1 tainted")
    assert "hw check" in node(coloc, "kn1")["metadata"]["annotations"][REASON_ANNOTATION]
    assert ours(coloc, "kn2") == []

    # The rack taint is tolerated by no pod either: it goes first, so only ours is left.
    coloc.kube.kubectl("taint", "nodes", "kn1", "example.com/rack=7:NoSchedule-")
    pinned_pod(coloc, "pinned", "n1")
    wait_until(lambda: unschedulable(coloc, "pinned"), 30, what="the pod found unschedulable")
    assert coloc.kube.get("pod", "pinned", "default")["spec"].get("nodeName") is None  # type: ignore[index]

    coloc.kube.kubectl("taint", "nodes", "kn1", "example.com/rack=7:NoSchedule")
    coloc.slurm.run("scontrol", "update", "nodename=n1", "state=resume")
    wait_until(lambda: ours(coloc, "kn1") == [], 60, what="our taint lifted")
    taints = node(coloc, "kn1")["spec"]["taints"]
    assert [{k: t[k] for k in ("key", "value", "effect")} for t in taints] == [RACK]
    assert REASON_ANNOTATION not in node(coloc, "kn1")["metadata"].get("annotations", {})
    assert any(m.startswith("Node tainted nodeledger.io/") for m in events(coloc, "kn1"))
    assert any("taint lifted" in m for m in events(coloc, "kn1"))


def test_turned_off_the_service_removes_its_own_taints(
    env: tuple[Coloc, ServiceProcess],
) -> None:
    coloc, service = env
    coloc.slurm.run("scontrol", "update", "nodename=n2", "state=drain", "reason=hw check")
    wait_until(lambda: len(ours(coloc, "kn2")) == 1, 60, what="kn2 tainted")
    service.process.terminate()
    service.process.wait(15)
    coloc.env["NODELEDGER_KUBE_SLURM_TAINTS"] = "false"
    with coloc.service("nodeledger-without-taints"):
        wait_until(lambda: ours(coloc, "kn2") == [], 60, what="our taint removed")
    coloc.slurm.run("scontrol", "update", "nodename=n2", "state=resume")


def slurm_node(coloc: Coloc, name: str) -> tuple[set[str], str]:
    node = coloc.slurm.node(name)
    return set(node["state"]), str(node.get("reason") or "")


def test_a_cordon_drains_slurm_and_the_uncordon_resumes_it(
    env: tuple[Coloc, ServiceProcess],
) -> None:
    coloc, _ = env
    coloc.kube.kubectl("cordon", "kn1")
    wait_until(lambda: "DRAIN" in slurm_node(coloc, "n1")[0], 60, what="n1 drained")
    assert slurm_node(coloc, "n1")[1].startswith("nodeledger: cordoned in Kubernetes at ")
    job = coloc.slurm.sbatch("-w", "n1", "-c", "1", "--mem=100", "--wrap", "sleep 300")
    assert ours(coloc, "kn1") == []  # the service's own drain taints nothing: no loop

    coloc.kube.kubectl("uncordon", "kn1")
    wait_until(lambda: "DRAIN" not in slurm_node(coloc, "n1")[0], 60, what="n1 resumed")
    wait_until(lambda: coloc.slurm.job_state(job) == "RUNNING", 60, what="the job running")
    coloc.slurm.scancel(job)
    said = events(coloc, "kn1")
    assert any(m.startswith("Slurm node n1 drained: nodeledger: cordoned") for m in said)
    assert "Slurm node n1 resumed: the Node was uncordoned" in said


def test_an_uncordon_leaves_an_administrators_drain_alone(
    env: tuple[Coloc, ServiceProcess],
) -> None:
    coloc, _ = env
    coloc.kube.kubectl("cordon", "kn2")
    wait_until(lambda: "DRAIN" in slurm_node(coloc, "n2")[0], 60, what="n2 drained")
    # Meanwhile an administrator drains it for their own reason.
    coloc.slurm.run("scontrol", "update", "nodename=n2", "state=drain", "reason=bad DIMM")
    wait_until(
        lambda: "bad DIMM" in (coloc.ledger_node("kn2").get("health_reason") or ""),
        60,
        what="the ledger sees the administrator's drain",
    )
    coloc.kube.kubectl("uncordon", "kn2")
    # A marker that the service has handled that uncordon: a cordon of kn3 after it,
    # relayed to Slurm (the reconciler takes changes in passes, each over all marked).
    coloc.kube.kubectl("cordon", "kn3")
    wait_until(lambda: "DRAIN" in slurm_node(coloc, "n3")[0], 60, what="n3 drained")
    state, reason = slurm_node(coloc, "n2")
    assert "DRAIN" in state
    assert reason == "bad DIMM"
    left = "Slurm node n2 left as it is: the Node was uncordoned, and Slurm node n2 is DRAIN"
    assert any(m.startswith(left) and "bad DIMM" in m for m in events(coloc, "kn2"))
    coloc.kube.kubectl("uncordon", "kn3")
    wait_until(lambda: "DRAIN" not in slurm_node(coloc, "n3")[0], 60, what="n3 resumed")
    coloc.slurm.run("scontrol", "update", "nodename=n2", "state=resume")


def metric(coloc: Coloc, name: str) -> float:
    text = httpx.get(f"{coloc.url}/metrics", timeout=30).text
    (value,) = [line.split()[1] for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(value)


def test_with_slurmrestd_stopped_a_cordon_drains_nothing_until_it_answers(
    env: tuple[Coloc, ServiceProcess], restd_restarted: SlurmCluster
) -> None:
    coloc, _ = env
    disagreeing = "nodeledger_maintenance_disagreeing_nodes"
    assert metric(coloc, disagreeing) == 0
    restd_restarted.stop_restd()
    coloc.kube.kubectl("cordon", "kn2")
    wait_until(lambda: metric(coloc, disagreeing) == 1, 60, what="the disagreement counted")
    time.sleep(3)  # passes every half second, each failing: none guesses
    assert "DRAIN" not in slurm_node(coloc, "n2")[0]  # scontrol: slurmctld itself
    assert metric(coloc, "nodeledger_maintenance_oldest_disagreement_seconds") >= 2

    restd_restarted.start_restd()
    wait_until(lambda: "DRAIN" in slurm_node(coloc, "n2")[0], 60, what="n2 drained")
    assert slurm_node(coloc, "n2")[1].startswith("nodeledger: cordoned in Kubernetes at ")
    wait_until(lambda: metric(coloc, disagreeing) == 0, 60, what="the sides agreeing")
    coloc.kube.kubectl("uncordon", "kn2")
    wait_until(lambda: "DRAIN" not in slurm_node(coloc, "n2")[0], 60, what="n2 resumed")
