"""The product deployed: the chart installed from the service's own image into the test
cluster with real nodes (tests.support.deploy), measured as a site would see it.

Prints one JSON object: the image's size; seconds from `helm install` to every replica and
the scheduler ready; pod create to Running, p50/p99, through the nodeledger scheduler and
through the default scheduler in the same run (interleaved): over a burst of N pods per
scheduler created back to back, and over M pods per scheduler created one at a time, each
once the one before runs; and the service's RSS and CPU in its pod, idle and during the
burst.

    python -m bench.deploy [--pods 100] [--one-at-a-time 20] [--keep]

Uses the cluster, Slurm and PostgreSQL that tests/deploy uses (started if not up) and
installs release `nl` in namespace `nodeledger`: run it while those tests are not running.
--keep leaves the release installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._stats import percentile
from bench.image import figures as image_figures
from bench.kubescale.proc import CpuWindow, peak_rss_mb, rss_mb
from tests.support.deploy import (
    NAMESPACE,
    RELEASE,
    RUNDIR,
    SERVER_PODS,
    Helm,
    Release,
    build_image,
    busybox_pod,
    start_kube,
    start_postgres,
    start_slurm,
    values,
    write_values,
)
from tests.support.kube_cluster import KubeCluster


def say(message: str) -> None:
    print(f"bench.deploy: {message}", file=sys.stderr, flush=True)


def container_pid(pod_uid: str, command: str) -> int:
    """The host PID of the pod's process whose command line contains ``command``: found by
    the pod's cgroup (kubelet names it pod<uid>)."""
    marker = f"pod{pod_uid}"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "cgroup").read_text() and command in (
                proc / "cmdline"
            ).read_bytes().decode(errors="replace"):
                return int(proc.name)
        except OSError:
            continue
    raise LookupError(f"no process of pod {pod_uid} runs {command!r}")


def create_to_running(kube: KubeCluster, count: int) -> dict[str, Any]:
    """Pods created one at a time, alternating between the two schedulers; for each, the
    seconds from its create call's answer to the first time it is seen Running."""
    created: dict[str, tuple[str, float]] = {}
    for i in range(count):
        for scheduler in ("nodeledger", "default-scheduler"):
            name = f"bench-{scheduler.split('-')[0]}-{i}"
            pod = busybox_pod(name, "sleep 3600", scheduler=scheduler, cpu="10m", grace=1)
            pod["metadata"]["labels"] = {"bench": "deploy"}
            kube.create(pod)
            created[name] = (scheduler, time.monotonic())
    running: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while len(running) < len(created) and time.monotonic() < deadline:
        items = kube.kubectl_json("get", "pods", "-l", "bench=deploy")["items"]
        now = time.monotonic()
        for p in items:
            name = p["metadata"]["name"]
            if name not in running and p["status"].get("phase") == "Running":
                running[name] = now - created[name][1]
        time.sleep(0.2)
    figures: dict[str, Any] = {}
    for scheduler in ("nodeledger", "default-scheduler"):
        seconds = [s for n, s in running.items() if created[n][0] == scheduler]
        figures[scheduler] = {
            "pods": count,
            "running": len(seconds),
            "p50_s": round(percentile(seconds, 50), 3) if seconds else None,
            "p99_s": round(percentile(seconds, 99), 3) if seconds else None,
            "mean_s": round(statistics.fmean(seconds), 3) if seconds else None,
        }
    kube.kubectl("delete", "pods", "-l", "bench=deploy", "--grace-period=1", timeout=300)
    return figures


def one_at_a_time(kube: KubeCluster, count: int) -> dict[str, Any]:
    """Pods created one after the other, each once the one before runs: the latency of a
    pod with the cluster otherwise quiet (alternating schedulers, as above)."""
    seconds: dict[str, list[float]] = {"nodeledger": [], "default-scheduler": []}
    for i in range(count):
        for scheduler, samples in seconds.items():
            name = f"seq-{scheduler.split('-')[0]}-{i}"
            pod = busybox_pod(name, "sleep 3600", scheduler=scheduler, cpu="10m", grace=1)
            pod["metadata"]["labels"] = {"bench": "deploy-seq"}
            started = time.monotonic()
            kube.create(pod)
            while (
                kube.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}") != "Running"
                and time.monotonic() - started < 120
            ):
                time.sleep(0.05)
            samples.append(time.monotonic() - started)
    kube.kubectl("delete", "pods", "-l", "bench=deploy-seq", "--grace-period=1", timeout=300)
    return {
        scheduler: {
            "pods": count,
            "p50_s": round(percentile(s, 50), 3),
            "p99_s": round(percentile(s, 99), 3),
        }
        for scheduler, s in seconds.items()
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--one-at-a-time", type=int, default=20, help="pods per scheduler")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--slurm", default="26.05", help="Slurm release of the deploy cluster")
    args = parser.parse_args(argv)

    say("starting the cluster with nodes, Slurm and PostgreSQL")
    kube, slurm, postgres = start_kube(), start_slurm(args.slurm), start_postgres()
    archive = build_image()
    kube.script("load-image", str(archive), timeout=600)
    helm = Helm.of(kube)
    if RELEASE in helm("list", "-n", NAMESPACE, "-q").split():
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    kube.kubectl("create", "namespace", NAMESPACE, check=False)
    kube.kubectl("-n", NAMESPACE, "delete", "secret", "slurm-jwt", "--ignore-not-found")
    kube.kubectl(
        "-n", NAMESPACE, "create", "secret", "generic", "slurm-jwt",
        f"--from-literal=token={slurm.token}",
    )  # fmt: skip
    chart_values = values(postgres, slurm)
    path = write_values(Path(RUNDIR) / "bench-values.json", chart_values)
    say("helm install")
    release = Release.install(helm, kube, slurm, path, chart_values)
    server = release.pods(SERVER_PODS)[0]
    pid = container_pid(server["metadata"]["uid"], "nodeledger")
    time.sleep(5)
    idle = CpuWindow(pid).start()
    time.sleep(20)
    idle_cpu = idle.percent()
    say(f"{args.pods} pods through each scheduler")
    busy = CpuWindow(pid).start()
    pods = create_to_running(kube, args.pods)
    busy_cpu = busy.percent()
    say(f"{args.one_at_a_time} pods one at a time through each scheduler")
    sequential = one_at_a_time(kube, args.one_at_a_time)
    figures = {
        "image": image_figures(archive),
        "helm_install_to_ready_s": round(release.install_seconds, 1),
        "pod_create_to_running_burst": pods,
        "pod_create_to_running_one_at_a_time": sequential,
        "service_in_pod": {
            "rss_mb": round(rss_mb(pid), 1),
            "peak_rss_mb": round(peak_rss_mb(pid), 1),
            "idle_cpu_percent": idle_cpu,
            "cpu_percent_during_burst": busy_cpu,
        },
    }
    if not args.keep:
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
