"""Placeholder pods on the real API server with the real kube-scheduler running the chart's
configuration for them (it filters itself, the extender binds) and real Slurm (issue 35).
Every test of tests/kube/test_e2e.py also runs through this configuration; on real
kubelets: tests/deploy/test_release.py."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from app.core.quantities import cpu_millis
from tests.kube.coloc import NODES, Coloc
from tests.support.service import ServiceProcess
from tests.support.slurm_cluster import wait_until

pytestmark = [pytest.mark.kube, pytest.mark.slurm]


@pytest.fixture
def placeholders() -> bool:
    return True


@pytest.fixture
def coloc(env: tuple[Coloc, ServiceProcess]) -> Coloc:
    return env[0]


@pytest.mark.kube_api  # the pod's resize subresource, on every minor
def test_a_placeholder_pod_carries_slurms_share_while_it_holds(coloc: Coloc) -> None:
    name = "nodeledger-held-kn2"
    assert coloc.kube.get("pod", name, namespace="default") is None  # an idle node has none
    job = coloc.slurm.sbatch("-w", "n2", "-c", "12", "--mem=1000", "--wrap", "sleep 300")

    def requests() -> dict[str, str] | None:
        pod = coloc.kube.get("pod", name, namespace="default")
        return None if pod is None else pod["spec"]["containers"][0]["resources"]["requests"]

    held = wait_until(lambda: requests(), 30, what="placeholder created")
    assert cpu_millis(held["cpu"]) == 12000
    assert coloc.kube.get("pod", name, namespace="default")["spec"]["nodeName"] == "kn2"
    # kube-scheduler counts it: a 6-CPU pod for kn2 waits, with its own reason, not ours.
    coloc.pod("six", "6", "1Gi", node_selector={"nodeledger.io/slurm-node": "n2"})
    wait_until(lambda: "Insufficient cpu" in coloc.events_for("six"), 30, what="FailedScheduling")
    assert coloc.kube.pod_node("six") is None
    assert len(coloc.pod_holdings()) == 0  # the placeholder is no pod holding of the ledger
    coloc.slurm.scancel(job)
    # The job ended: the placeholder goes, and the pod binds (through the ledger).
    wait_until(lambda: requests() is None, 30, what="placeholder deleted")
    assert coloc.kube.wait_bound("six", timeout=60) == "kn2"
    assert coloc.gres("n2")["k8scpu"] == 10


NODE_CPUS = 16
ROUNDS = 3
PODS_PER_ROUND = 20
JOBS_PER_ROUND = 6
SAMPLES = 12  # invariant checks per round, one a second, while pods and jobs settle


def race_pod(name: str, cpus: int) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "busybox",
        "resources": {"requests": {"cpu": str(cpus), "memory": "256Mi"}},
    }
    meta = {"name": name, "namespace": "default", "labels": {"race": "burst"}}
    spec = {"schedulerName": "nodeledger", "containers": [container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def bound_pod_cpus(coloc: Coloc) -> dict[str, int]:
    """Kubernetes node -> the CPUs (millicores) of the race's pods bound to it."""
    out = coloc.kube.kubectl("get", "pods", "-n", "default", "-l", "race=burst", "-o", "json")
    cpus: dict[str, int] = dict.fromkeys(NODES, 0)
    for pod in json.loads(out)["items"]:
        node = pod["spec"].get("nodeName")
        if node:
            requests = pod["spec"]["containers"][0]["resources"]["requests"]
            cpus[node] += cpu_millis(requests["cpu"])
    return cpus


def running_job_cpus(coloc: Coloc) -> dict[str, int]:
    """Slurm node -> the CPUs of its running jobs (squeue: what Slurm allocated)."""
    cpus: dict[str, int] = dict.fromkeys(NODES.values(), 0)
    out = coloc.slurm.run("squeue", "-h", "-t", "R,CG", "-o", "%N %C")
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2:  # a completing job may name no node any more
            cpus[fields[0]] = cpus.get(fields[0], 0) + int(fields[1])
    return cpus


@pytest.mark.parametrize("placeholders", [True, False], ids=["placeholders", "extender"])
def test_a_burst_of_pods_against_sbatch_jobs_never_oversubscribes_a_node(coloc: Coloc) -> None:
    """Issue 35, item 3, through the placeholder path: kube-scheduler places a burst of pods
    from what the placeholders say while sbatch jobs start on the same nodes, so it places
    some on nodes whose Slurm share just grew; only the bind's admission stands between
    them and the jobs (and the same burst through the extender's filter, the feature
    off). Pods are read before jobs, and no pod goes within a sample, so a sample's pods
    are a subset of those bound when the jobs were read: any sum above a node's CPUs is a
    real overlap."""
    rng = random.Random(35)
    bound_total = jobs_seen = 0
    for k in range(ROUNDS):
        pods = [race_pod(f"burst-{k}-{i}", rng.randint(1, 2)) for i in range(PODS_PER_ROUND)]
        slurm_nodes = list(NODES.values())
        jobs = [(rng.choice(slurm_nodes), rng.randint(2, 8)) for _ in range(JOBS_PER_ROUND)]
        with ThreadPoolExecutor(4) as pool:
            submitted = [
                pool.submit(coloc.slurm.sbatch, "-w", node, "-c", str(cpus), "--mem=500",
                            "--wrap", "sleep 30")
                for node, cpus in jobs
            ]  # fmt: skip
            for pod in pods:
                pool.submit(coloc.kube.create, pod)
            job_ids = [f.result() for f in submitted]
        try:
            for _ in range(SAMPLES):
                pod_cpus = bound_pod_cpus(coloc)
                job_cpus = running_job_cpus(coloc)
                for kube_node, slurm_node in NODES.items():
                    used = -(-pod_cpus[kube_node] // 1000) + job_cpus[slurm_node]
                    assert used <= NODE_CPUS, (
                        f"round {k}: {kube_node} has pods of {pod_cpus[kube_node]}m and "
                        f"{slurm_node} jobs of {job_cpus[slurm_node]} CPUs"
                    )
                jobs_seen = max(jobs_seen, sum(job_cpus.values()))
                time.sleep(1)
            bound_total += sum(1 for v in bound_pod_cpus(coloc).values() if v)
        finally:
            coloc.slurm.scancel(*job_ids)
            coloc.kube.kubectl("delete", "pods", "-n", "default", "-l", "race=burst",
                               "--grace-period=0", "--force", check=False)  # fmt: skip
            wait_until(lambda: not coloc.pod_holdings(), 60, what="the round's pods released")
    # Not vacuous: pods were bound and jobs ran beside them.
    assert bound_total > 0
    assert jobs_seen > 0
