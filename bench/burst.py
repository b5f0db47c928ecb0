"""Issue 35, item 3: a burst of pods through the nodeledger scheduler (placeholder pods: it
filters by itself, the service only binds) against `sbatch` jobs on the same co-managed
nodes, at site scale: zero oversubscription.

N API-only Nodes (64 CPU each), each labelled with its Slurm node, and a real 26.05
slurmctld + slurmrestd defining N nodes: n1-n8 with a slurmd (16 CPUs each), s1.. that
never register, set DOWN (their Nodes carry the service's taint, so no pod lands there).
`nodeledger serve` with both integrations on and placeholder pods, and a kube-scheduler
running the chart's configuration for them, started once the DOWN nodes' Nodes are all
tainted (as on a site whose nodes were down before the burst). Then, at once: --pods pods
(200m / 128Mi, for that scheduler) created as fast as the API server takes them, and jobs
(2-8 CPUs, 5-15 s each, on n1-n8 at random) kept --jobs in the queue. Beside it a sampler, every
--sample-interval seconds, reads the pods bound to each live Node, then Slurm's running
jobs on its node (squeue): a sample's pods are a subset of those bound when the jobs were
read (no pod is deleted meanwhile), so pods' CPUs (rounded up) + jobs' CPUs above 16 on a
node is a real overlap. Prints one JSON object: samples, overlaps (must be 0), pods bound
and their pods/s, jobs submitted, the binds admitted and refused.

    python -m bench.burst [--nodes 500] [--pods 2000] [--seconds 120] [--jobs 12] [--keep]

Runs on clusters of its own: Kubernetes in /tmp/nl-burst/kube (ports from 25379), Slurm in
/tmp/nl-burst/slurm (ports from 25600, the chroot copy in ~/.cache/nl-maint-scale). Not
part of CI; tests/kube/test_placeholders.py is its small, in-suite counterpart.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from app.core.quantities import cpu_millis
from bench._fixtures import free_port, migrated
from bench.kubescale.cluster import Api, ControlPlane, admin_client
from bench.kubescale.load import NAMESPACE, create_all, node_name
from bench.kubescale.service import Service
from bench.maintenance import (
    CACHE,
    LIVE,
    load_nodes,
    prepare_slurm,
    ready,
    slurm_name,
    tainted,
    until,
)
from bench.scheduler_throughput import Schedulers, service_figures
from bench.slurm_scale import scale_cluster

REPO = Path(__file__).resolve().parent.parent
RUNDIR = Path("/tmp/nl-burst")
CRD = REPO / "crds" / "genericnodes.nodeledger.io.yaml"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
NODE_CPUS = 16  # each live Slurm node's (cluster.sh)
PROFILE = "placeholders"
NOT_READY = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}


def say(message: str) -> None:
    print(f"burst: {message}", file=sys.stderr, flush=True)


def burst_pod(name: str) -> dict[str, Any]:
    container = {
        "name": "c",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": {"cpu": "200m", "memory": "128Mi"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"burst": "1"}},
        "spec": {
            "schedulerName": "nodeledger-ph",
            "containers": [container],
            # The API server taints every new Node not-ready, and no kubelet clears it.
            "tolerations": [NOT_READY],
        },
    }


class Sampler:
    """The invariant, read from both sides (pods first), every ``interval`` seconds."""

    def __init__(self, kube: httpx.Client, slurm: Any, node_of: dict[str, str]) -> None:
        self.kube, self.slurm, self.node_of = kube, slurm, node_of  # Node -> Slurm node
        self.samples = 0
        self.overlaps: list[dict[str, Any]] = []
        self.most: dict[str, int] = {}  # Slurm node -> most CPUs used at once (both sides)
        self.bound: dict[str, float] = {}  # pod -> when first seen bound

    def pods(self) -> dict[str, int]:
        """Slurm node -> millicores of the burst's pods bound to its Node."""
        millis: dict[str, int] = {}
        params = {"labelSelector": "burst=1"}
        items = self.kube.get(PODS, params=params, timeout=60).raise_for_status().json()["items"]
        now = time.monotonic()
        for pod in items:
            node = pod["spec"].get("nodeName")
            if node:
                self.bound.setdefault(pod["metadata"]["name"], now)
                slurm_node = self.node_of.get(node, node)
                cpu = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
                millis[slurm_node] = millis.get(slurm_node, 0) + cpu_millis(cpu)
        return millis

    def jobs(self) -> dict[str, int]:
        cpus: dict[str, int] = {}
        for line in self.slurm.run("squeue", "-h", "-t", "R,CG", "-o", "%N %C").splitlines():
            fields = line.split()
            if len(fields) == 2:  # a completing job may name no node any more
                cpus[fields[0]] = cpus.get(fields[0], 0) + int(fields[1])
        return cpus

    def sample(self) -> None:
        pods, jobs = self.pods(), self.jobs()
        self.samples += 1
        for node in LIVE:
            used = math.ceil(pods.get(node, 0) / 1000) + jobs.get(node, 0)
            self.most[node] = max(self.most.get(node, 0), used)
            if used > NODE_CPUS:
                self.overlaps.append(
                    {"node": node, "pods_millis": pods.get(node, 0), "jobs_cpus": jobs.get(node)}
                )

    def run(self, stop: threading.Event, interval: float) -> None:
        while not stop.is_set():
            self.sample()
            stop.wait(interval)


def churn(slurm: Any, stop: threading.Event, queued: int, seed: int, started: list[str]) -> None:
    """Keep ``queued`` jobs submitted (pending or running) on the live nodes."""
    rng = random.Random(seed)
    while not stop.is_set():
        mine = slurm.run("squeue", "-h", "-n", "burst", "-o", "%i").split()
        for _ in range(max(0, queued - len(mine))):
            node, cpus, seconds = rng.choice(LIVE), rng.randint(2, 8), rng.randint(5, 15)
            job = slurm.sbatch("-J", "burst", "-w", node, "-c", str(cpus), "--mem=500",
                               "--wrap", f"sleep {seconds}")  # fmt: skip
            started.append(job)
        stop.wait(0.5)


def measure(args: argparse.Namespace, plane: ControlPlane, api: Api) -> dict[str, Any]:
    nodes = args.nodes
    result: dict[str, Any] = {"nodes": nodes, "pods": args.pods, "seconds": args.seconds}
    result["load"] = load_nodes(api, nodes)
    down = nodes - len(LIVE)
    with scale_cluster(down, str(RUNDIR / "slurm"), args.slurm_port_base, cache=CACHE,
                       live=len(LIVE), keep=args.keep) as slurm:  # fmt: skip
        prepare_slurm(slurm, down)
        slurm.run("scontrol", "update", f"nodename={','.join(LIVE)}", "state=resume",
                  check=False)  # fmt: skip
        env = {**slurm.service_env, "NODELEDGER_SLURM_TIMEOUT": "120",
               "NODELEDGER_KUBE_PLACEHOLDERS": "true", "NODELEDGER_KUBE_STATUS_QPS": "200",
               "NODELEDGER_KUBE_STATUS_BURST": "200"}  # fmt: skip
        database = migrated(f"sqlite:///{RUNDIR}/ledger-{int(time.time())}.db")
        logs = RUNDIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        service = Service(database, plane.kubeconfig, free_port(), logs / "service.log", env)
        schedulers = Schedulers(plane, args.kube_port_base)
        service.start()
        try:
            service.wait("ready", lambda: ready(service), args.ready_timeout)
            result["ready_s"] = round(time.monotonic() - service.started, 1)
            node_of = {node_name(i): slurm_name(i) for i in range(nodes)}
            with admin_client(plane.kubeconfig) as kube:
                # As on a site whose nodes were down before the burst: their Nodes tainted.
                t0 = time.monotonic()
                if not until(lambda: tainted(kube) >= down, args.ready_timeout):
                    raise RuntimeError(f"the {down} DOWN nodes' Nodes were not all tainted")
                result["down_tainted_s"] = round(time.monotonic() - t0, 1)
            schedulers.start(PROFILE, service.url)
            before = service_figures(service)
            with admin_client(plane.kubeconfig) as kube:
                sampler = Sampler(kube, slurm, node_of)
                stop, jobs = threading.Event(), list[str]()
                threads = [
                    threading.Thread(target=sampler.run, args=(stop, args.sample_interval)),
                    threading.Thread(target=churn, args=(slurm, stop, args.jobs, 35, jobs)),
                ]
                for thread in threads:
                    thread.start()
                t0 = time.monotonic()
                pods = (burst_pod(f"burst-{i:05d}") for i in range(args.pods))
                result["created"] = api.run(lambda a: create_all(a, "pods", PODS, pods))
                time.sleep(max(0.0, args.seconds - (time.monotonic() - t0)))
                stop.set()
                for thread in threads:
                    thread.join()
                sampler.sample()  # one more, once the jobs stopped coming
            after = service_figures(service)
            bound = sorted(sampler.bound.values())
            result |= {
                "samples": sampler.samples,
                "overlaps": len(sampler.overlaps),
                "overlap_examples": sampler.overlaps[:5],
                "most_cpus_used_of_16": sampler.most,
                "pods_bound": len(bound),
                "pods_per_s": round((len(bound) - 1) / (bound[-1] - bound[0]), 1)
                if len(bound) > 1 and bound[-1] > bound[0] else None,
                "jobs_submitted": len(jobs),
                "service": {k: after.get(k, 0) - before.get(k, 0) for k in sorted(after)
                            if "extender_requests" in k or "placeholder" in k
                            or k.startswith("nodeledger_admissions_total")},
            }  # fmt: skip
        finally:
            schedulers.stop(PROFILE)
            service.stop()
            slurm.run("scancel", "-n", "burst", check=False)
            api.run(lambda a: a.call("DELETE", PODS, {"gracePeriodSeconds": 0}))
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--nodes", type=int, default=500)
    add("--pods", type=int, default=2000)
    add("--seconds", type=float, default=120.0, help="of the burst, jobs churning throughout")
    add("--jobs", type=int, default=12, help="jobs kept in the queue")
    add("--sample-interval", type=float, default=0.5)
    add("--ready-timeout", type=float, default=1800.0)
    add("--kube-port-base", type=int, default=25379)
    add("--slurm-port-base", type=int, default=25600)
    add("--keep", action="store_true", help="leave the clusters up")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    RUNDIR.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(RUNDIR / "kube", args.kube_port_base)
    plane.up()
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load": os.getloadavg()}}
    try:
        plane.kubectl("apply", "-f", str(CRD))
        plane.kubectl("wait", "--for=condition=Established", "crd/genericnodes.nodeledger.io")
        api = Api(plane.kubeconfig, 32)
        api.run(lambda a: a.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}))
        report |= measure(args, plane, api)
    finally:
        if not args.keep:
            plane.down()
        report["machine"]["load_end"] = os.getloadavg()
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
