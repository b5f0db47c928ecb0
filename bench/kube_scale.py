"""The Kubernetes side at scale: N Nodes with 10 bound pods each in a real kube-apiserver,
and `nodeledger serve` (PostgreSQL ledger, Kubernetes integration on) measured against it.

Prints one JSON object with, per size: how fast the API server took the Nodes and pods
and its and etcd's memory afterwards; for a cold start (empty ledger) and a restart on the
filled ledger: seconds to /readyz and to all watches synced, RSS; then idle CPU over 30 s,
a full periodic resync (list and resync seconds per watch, from the service's log), CPU
under pod churn, and GenericNode status writes per second during a burst of changes.

    python -m bench.kube_scale [--nodes 100,1000] [--keep] [--status-qps 20]
                               [--list-page-size 2000] [--resync-period 90]

Runs on a control plane of its own (NODELEDGER_RUNDIR=/tmp/nodeledger-kube-scale, ports
from 22379, no kube-scheduler) and a PostgreSQL of its own in the same directory, so the
shared test control plane is never touched. Sizes load incrementally (100, then 900 more,
...); --keep leaves both up for a next run, which then loads only what is missing. Not
part of CI: 15,000 nodes (150,000 pods) take long to load on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._fixtures import free_port, postgres_database
from bench.kubescale.cluster import Api, ControlPlane
from bench.kubescale.load import PODS_PER_NODE, load
from bench.kubescale.proc import CpuWindow, peak_rss_mb, rss_mb
from bench.kubescale.service import WRITES, Service, settle
from bench.kubescale.workload import burst, churn, unburst

REPO = Path(__file__).resolve().parent.parent

RUNDIR = Path("/tmp/nodeledger-kube-scale")
CRD = REPO / "crds" / "genericnodes.nodeledger.io.yaml"


def say(message: str) -> None:
    print(f"kube-scale: {message}", file=sys.stderr, flush=True)


def postgres_up() -> str:
    env = {**os.environ, "NODELEDGER_RUNDIR": str(RUNDIR)}
    script = REPO / "testenv" / "postgres" / "pg.sh"
    out = subprocess.run(
        ["bash", str(script), "up"], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def postgres_down() -> None:
    env = {**os.environ, "NODELEDGER_RUNDIR": str(RUNDIR)}
    subprocess.run(["bash", str(REPO / "testenv/postgres/pg.sh"), "down"], env=env, check=False)


def daemons(plane: ControlPlane) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("kube-apiserver", "etcd"):
        pid = plane.pid(name)
        if pid is not None:
            out[name] = {"rss_mb": round(rss_mb(pid)), "peak_rss_mb": round(peak_rss_mb(pid))}
    return out


def start(service: Service, timeout: float) -> dict[str, Any]:
    service.start()
    ready = service.wait("readyz", lambda: service.readyz() is not None, timeout)
    synced = service.wait("synced", service.synced, timeout)
    return {"ready_s": ready, "synced_s": synced}


def idle(service: Service, plane: ControlPlane, seconds: float) -> dict[str, Any]:
    """CPU over ``seconds`` with nothing changing; a window in which a periodic resync ran
    is measured again (up to 5 times), so the figure is what idling costs."""
    for attempt in range(1, 6):
        windows = {"service": CpuWindow(service.pid).start()}
        for name in ("kube-apiserver", "etcd"):
            if (pid := plane.pid(name)) is not None:
                windows[name] = CpuWindow(pid).start()
        writes, resyncs = service.counter(WRITES), len(service.resyncs())
        time.sleep(seconds)
        quiet = len(service.resyncs()) == resyncs
        if quiet or attempt == 5:
            return {
                "seconds": seconds,
                "cpu_percent": {k: w.percent() for k, w in windows.items()},
                "status_writes": int(service.counter(WRITES) - writes),
                "windows_with_a_resync_skipped": attempt - 1 if quiet else attempt,
            }
    raise AssertionError("unreachable")


def periodic_resync(service: Service, period: float, idle_percent: float) -> dict[str, Any]:
    """Wait for the next periodic resync of the pods (from the watch, no LIST) and the
    status resync after it."""
    seen = len(service.resyncs())
    window = CpuWindow(service.pid).start()
    deadline = time.monotonic() + period + 600
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = service.resyncs()[seen:]
        names = {r["watch"] for r in found}
        if {"pods", "genericnode-status"} <= names:
            break
        time.sleep(1)
    time.sleep(2)
    found = service.resyncs()[seen:]
    wall = time.monotonic() - window.wall0
    return {
        "watches": found,
        # CPU above idle spent in this window: what one full resync costs.
        "cpu_s": round(window.cpu_used() - idle_percent / 100 * wall, 1),
    }


def under_churn(service: Service, api: Api, nodes: int, rate: float) -> dict[str, Any]:
    window = CpuWindow(service.pid).start()
    done = api.run(lambda a: churn(a, nodes, rate, 30))
    cpu = window.percent()
    started = time.monotonic()
    expected = f"{PODS_PER_NODE * 100}m" if PODS_PER_NODE * 100 % 1000 else "1"
    sample = done["nodes"][:: max(1, len(done["nodes"]) // 20)]

    def back() -> bool:
        return all(service.node(n)["held_by_kubernetes"]["cpu"] == expected for n in sample)

    while not back() and time.monotonic() - started < 120:
        time.sleep(0.5)
    return {
        "rate_per_s": rate,
        "seconds": 30,
        "created": done["created"],
        "deleted": done["deleted"],
        "cpu_percent": cpu,
        "ledger_back_after_s": round(time.monotonic() - started, 1) if back() else None,
    }


def writes_during_burst(
    service: Service, api: Api, nodes: int, count: int, qps: float
) -> dict[str, Any]:
    before = service.counter(WRITES)
    started = time.monotonic()
    names = api.run(lambda a: burst(a, nodes, count))
    samples: list[tuple[float, float]] = []
    while time.monotonic() - started < count / qps + 60:
        written = service.counter(WRITES) - before
        samples.append((time.monotonic() - started, written))
        if written >= count:
            break
        time.sleep(0.5)
    seconds, written = samples[-1]
    first = next(((t, w) for t, w in samples if t >= 5), samples[-1])
    api.run(lambda a: unburst(a, names))
    return {
        "nodes_changed": count,
        "written": int(written),
        "seconds": round(seconds, 1),
        "writes_per_s": round(written / seconds, 1) if seconds else None,
        "first_5s_writes": int(first[1]),
    }


def measure(
    nodes: int, plane: ControlPlane, api: Api, pg: str, args: argparse.Namespace
) -> dict[str, Any]:
    say(f"{nodes} nodes: loading")
    result: dict[str, Any] = {"nodes": nodes, "pods": nodes * PODS_PER_NODE}
    result["load"] = api.run(lambda a: load(a, nodes))
    result["control_plane_after_load"] = daemons(plane)
    env = {
        "NODELEDGER_KUBE_RESYNC_PERIOD": str(args.resync_period),
        "NODELEDGER_KUBE_STATUS_QPS": str(args.status_qps),
        "NODELEDGER_KUBE_STATUS_BURST": str(args.status_burst),
        "NODELEDGER_KUBE_LIST_PAGE_SIZE": str(args.list_page_size),
    }
    logs = RUNDIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # The first start writes every GenericNode's status: --cold-status-qps may hurry it.
    cold_qps = args.cold_status_qps or args.status_qps
    cold_env = {**env, "NODELEDGER_KUBE_STATUS_QPS": str(cold_qps)}
    with postgres_database(pg) as url:
        say(f"{nodes} nodes: cold start (empty ledger)")
        cold = Service(url, plane.kubeconfig, free_port(), logs / f"cold-{nodes}.log", cold_env)
        try:
            result["cold_start"] = start(cold, args.ready_timeout)
            result["cold_start"]["rss_mb"] = round(rss_mb(cold.pid))
            result["cold_start"]["first_resyncs"] = cold.resyncs()
            result["cold_start"]["status_qps"] = cold_qps
            # After recording 150,000 pods the status mirror replays as many ledger events,
            # which pauses its writes for tens of seconds.
            result["cold_start"].update(settle(cold, nodes / cold_qps + 300, quiet=90))
        finally:
            cold.stop()
        say(f"{nodes} nodes: restart on the filled ledger")
        warm = Service(url, plane.kubeconfig, free_port(), logs / f"warm-{nodes}.log", env)
        try:
            restart = result["restart"] = start(warm, args.ready_timeout)
            restart["first_resyncs"] = warm.resyncs()
            restart.update(settle(warm, nodes / args.status_qps + 120))
            restart["rss_mb"] = round(rss_mb(warm.pid))
            say(f"{nodes} nodes: idle")
            result["idle"] = idle(warm, plane, 30)
            say(f"{nodes} nodes: waiting for a periodic resync")
            service_idle = result["idle"]["cpu_percent"]["service"]
            result["full_resync"] = periodic_resync(warm, args.resync_period, service_idle)
            say(f"{nodes} nodes: churn")
            result["churn"] = under_churn(warm, api, nodes, args.churn_rate)
            say(f"{nodes} nodes: burst")
            count = min(nodes, args.burst)
            result["burst"] = writes_during_burst(warm, api, nodes, count, args.status_qps)
            result["rss_mb_end"] = round(rss_mb(warm.pid))
            result["peak_rss_mb"] = round(peak_rss_mb(warm.pid))
        finally:
            warm.stop()
    result["control_plane_end"] = daemons(plane)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--nodes", default="100,1000", help="sizes, ascending (e.g. 100,1000,15000)")
    add("--keep", action="store_true", help="leave the control plane and PostgreSQL up")
    add("--status-qps", type=float, default=20.0)
    add("--status-burst", type=int, default=50)
    add("--cold-status-qps", type=float, help="status writes/s of the first start only")
    add("--resync-period", type=float, default=90.0)
    add("--list-page-size", type=int, default=2000)
    add("--ready-timeout", type=float, default=1800.0)
    add("--churn-rate", type=float, default=20.0, help="pods created (and deleted) per s")
    add("--burst", type=int, default=500, help="nodes changed at once")
    add("--concurrency", type=int, default=32, help="API requests in flight while loading")
    add("--port-base", type=int, default=22379)
    args = parser.parse_args(argv)
    sizes = sorted(int(n) for n in args.nodes.split(","))

    plane = ControlPlane(RUNDIR, args.port_base)
    say("control plane up")
    plane.up()
    plane.kubectl("apply", "-f", str(CRD))
    plane.kubectl("wait", "--for=condition=Established", "crd/genericnodes.nodeledger.io")
    pg = postgres_up()
    api = Api(plane.kubeconfig, args.concurrency)
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "sizes": []}
    try:
        for nodes in sizes:
            report["sizes"].append(measure(nodes, plane, api, pg, args))
            print(json.dumps(report["sizes"][-1]), file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            plane.down()
            postgres_down()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
