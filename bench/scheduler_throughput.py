"""Pods per second at site scale: the nodeledger scheduler (a second kube-scheduler with
the chart's configuration) against kube-scheduler's default profile, on the same API-only
Nodes.

Per size: N Nodes (64 CPU / 256Gi each, no kubelets) discovered by `nodeledger serve`
(PostgreSQL, Kubernetes on with placeholder pods, Slurm off); then rounds alternating the
profiles (default, placeholders, default, placeholders...), so load drift hits all. A round
creates --pods pods for one scheduler, then starts that scheduler, and times every pod from
its creation to the watch event that shows it bound; then the pods are deleted and the
ledger has released them before the next round. Prints one JSON object: per size and
profile pods/s (first to last bind), create-to-bound p50/p99, the scheduler's own attempt
and extension-point times, and for the nodeledger profiles the extender's calls, bytes and
seconds per verb (the service's nodeledger_extender_* metrics) and the ledger's admissions
(each bind is one). Profiles: ``default``; ``placeholders``, the chart's default
(kube-scheduler-config-placeholders.yaml: the extender binds, and filters GPU pods);
``nodeledger``, the chart with kube.placeholders.enabled=false (the extender filters,
prioritizes and binds); ``no-prioritize``, that without prioritize.

    python -m bench.scheduler_throughput [--nodes 500,5000] [--pods 1000] [--rounds 2]
                                         [--profiles default,placeholders] [--keep]

Runs on a control plane and a PostgreSQL of its own (/tmp/nl-tput-scale, ports from 24379,
schedulers on the port base + 20..23); sizes load incrementally and --keep leaves both up
so a next run loads only the missing Nodes. Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

import aiohttp
import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench._fixtures import free_port, postgres_database
from bench._stats import summary
from bench.kubescale.cluster import SCRIPT, Api, ControlPlane
from bench.kubescale.load import NAMESPACE, create_all, node_name, node_object
from bench.kubescale.service import Service

REPO = Path(__file__).resolve().parent.parent
RUNDIR = Path("/tmp/nl-tput-scale")
CRD = REPO / "crds" / "genericnodes.nodeledger.io.yaml"
FILES = REPO / "charts" / "nodeledger" / "files"
CHART_CONFIG = FILES / "kube-scheduler-config.yaml"
PLACEHOLDER_CONFIG = FILES / "kube-scheduler-config-placeholders.yaml"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
# Profile -> schedulerName. "no-prioritize": the chart's extender without its prioritize
# verb (filter and bind only), an option weighed in docs/design.md. "placeholders": the
# chart's configuration with kube.placeholders.enabled (the extender binds only, and
# filters GPU pods), the service keeping placeholder pods.
PROFILES = {
    "default": "tput-default",
    "nodeledger": "nodeledger",
    "no-prioritize": "nodeledger-np",
    "placeholders": "nodeledger-ph",
}
NODELEDGER_PROFILES = ("nodeledger", "no-prioritize", "placeholders")
WRITES = "nodeledger_kube_status_writes_total"


def say(message: str) -> None:
    print(f"scheduler-throughput: {message}", file=sys.stderr, flush=True)


def postgres(command: str) -> str:
    env = {**os.environ, "NODELEDGER_RUNDIR": str(RUNDIR)}
    script = REPO / "testenv" / "postgres" / "pg.sh"
    out = subprocess.run(["bash", str(script), command], env=env, capture_output=True, text=True)
    if command == "up" and out.returncode != 0:
        raise RuntimeError(f"pg.sh up: {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def scheduler_config(profile: str, run: Path, extender_url: str) -> dict[str, Any]:
    """The chart's configuration for nodeledger (extender pointed at this service); the
    same without extenders for the default profile. The client's QPS stays kube-scheduler's
    default in both, as on a site."""
    source = PLACEHOLDER_CONFIG if profile == "placeholders" else CHART_CONFIG
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    config["clientConnection"] = {"kubeconfig": str(run / "scheduler.kubeconfig")}
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [{"schedulerName": PROFILES[profile]}]
    if profile == "default":
        del config["extenders"]
    else:
        for extender in config["extenders"]:
            extender["urlPrefix"] = f"{extender_url}/v1/extender"
    if profile == "no-prioritize":
        del config["extenders"][0]["prioritizeVerb"]
    return config


def pod_object(name: str, scheduler: str, round_label: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"round": round_label}},
        "spec": {
            "schedulerName": scheduler,
            # The API server taints every new Node not-ready, and no kubelet clears it.
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoSchedule",
                }
            ],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
        },
    }


class Schedulers:
    """kube-scheduler processes started and stopped by cluster.sh, scraped as admin."""

    def __init__(self, plane: ControlPlane, port_base: int) -> None:
        self.plane = plane
        self.run = Path(plane.exports()["NODELEDGER_KUBE_RUN"])
        self.ports = {name: port_base + 20 + k for k, name in enumerate(PROFILES)}
        user = yaml.safe_load(plane.kubeconfig.read_text())["users"][0]["user"]
        self.cert = RUNDIR / "tput-admin.crt", RUNDIR / "tput-admin.key"
        self.cert[0].write_bytes(base64.b64decode(user["client-certificate-data"]))
        self.cert[1].write_bytes(base64.b64decode(user["client-key-data"]))
        # The scheduler serves a self-signed certificate; the admin's cert authorizes /metrics.
        self.tls = ssl.create_default_context()
        self.tls.check_hostname = False
        self.tls.verify_mode = ssl.CERT_NONE
        self.tls.load_cert_chain(*self.cert)

    def _script(self, *args: str) -> None:
        env = {
            **os.environ,
            "NODELEDGER_RUNDIR": str(self.plane.rundir),
            "NODELEDGER_KUBE_PORT_BASE": str(self.plane.port_base),
            "NODELEDGER_KUBE_SCHEDULER": "false",
        }
        out = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"cluster.sh {' '.join(args)}: {out.stderr[-2000:]}")

    def start(self, profile: str, extender_url: str) -> None:
        config = scheduler_config(profile, self.run, extender_url)
        with tempfile.NamedTemporaryFile(
            "w", dir=RUNDIR, prefix=f"{profile}-", suffix=".yaml", delete=False
        ) as f:
            yaml.safe_dump(config, f)
        self._script("scheduler", f"tput-{profile}", f.name, str(self.ports[profile]))

    def stop(self, profile: str) -> None:
        self._script("stop-scheduler", f"tput-{profile}")

    def figures(self, profile: str) -> dict[str, Any]:
        """Mean seconds per scheduling attempt and per extension point (kube-scheduler's
        own histograms: the extender's filter and prioritize fall inside the algorithm's
        time, not in any extension point)."""
        url = f"https://127.0.0.1:{self.ports[profile]}/metrics"
        text = httpx.get(url, verify=self.tls, timeout=30).text
        sums: dict[str, list[float]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "scheduler_scheduling_attempt_duration_seconds_sum":
                    key = f"attempt/{s.labels.get('result')}"
                elif s.name == "scheduler_scheduling_algorithm_duration_seconds_sum":
                    key = "algorithm"
                elif s.name == "scheduler_framework_extension_point_duration_seconds_sum":
                    if s.labels.get("status") != "Success":
                        continue
                    key = f"point/{s.labels.get('extension_point')}"
                else:
                    continue
                count = next(
                    c.value
                    for c in family.samples
                    if c.name == s.name.replace("_sum", "_count") and c.labels == s.labels
                )
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0] += s.value
                acc[1] += count
        return {
            k: {"count": int(n), "mean_ms": round(1000 * t / n, 2)}
            for k, (t, n) in sums.items()
            if n
        }


def service_figures(service: Service) -> dict[str, float]:
    """The service's extender and admission series, by series name and labels."""
    text = httpx.get(f"{service.url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(("nodeledger_extender_", "nodeledger_admissions_total")) or (
                s.name in ("nodeledger_releases_total", WRITES)
            ):
                if s.name.endswith("_bucket"):
                    continue
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def extender_share(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Calls, bytes and seconds per verb between two scrapes."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    verbs: dict[str, Any] = {}
    for verb in ("filter", "prioritize", "bind"):
        calls = delta(f"nodeledger_extender_request_duration_seconds_count{{verb={verb}}}")
        if not calls:
            continue
        seconds = delta(f"nodeledger_extender_request_duration_seconds_sum{{verb={verb}}}")
        received = delta(f"nodeledger_extender_bytes_total{{direction=received,verb={verb}}}")
        sent = delta(f"nodeledger_extender_bytes_total{{direction=sent,verb={verb}}}")
        verbs[verb] = {
            "calls": int(calls),
            "mean_ms": round(1000 * seconds / calls, 2),
            "total_s": round(seconds, 2),
            "request_bytes_mean": round(received / calls),
            "response_bytes_mean": round(sent / calls),
        }
    admitted = delta("nodeledger_admissions_total{path=extender,result=admitted}")
    return {"verbs": verbs, "ledger_admissions": int(admitted)}


async def watch_bound(api: Api, label: str, rv: str, count: int, bound: dict[str, float]) -> None:
    """Record when each pod of the round is first seen with spec.nodeName; a watch that
    ends is resumed from its last resourceVersion, one that expired from a new list."""
    assert api.session is not None
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    selector = f"round={label}"
    while len(bound) < count:
        params = {"watch": "1", "labelSelector": selector, "resourceVersion": rv,
                  "allowWatchBookmarks": "true", "timeoutSeconds": "600"}  # fmt: skip
        async with api.session.get(api.server + PODS, params=params, timeout=timeout) as response:
            async for line in response.content:
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    say(f"watch of {label}: {str(obj)[:200]}; listing again")
                    _, listing = await api.call("GET", PODS, params={"labelSelector": selector})
                    for pod in listing["items"]:
                        if pod["spec"].get("nodeName"):
                            bound.setdefault(pod["metadata"]["name"], time.time())
                    rv = listing["metadata"]["resourceVersion"]
                    break
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                name = (obj.get("metadata") or {}).get("name")
                if name and name not in bound and (obj.get("spec") or {}).get("nodeName"):
                    bound[name] = time.time()
                    if len(bound) >= count:
                        return


async def create_pods(api: Api, pods: list[dict[str, Any]], created: dict[str, float]) -> None:
    todo = iter(pods)

    async def worker() -> None:
        for pod in todo:
            status, body = await api.call("POST", PODS, pod)
            if status != 201:
                raise RuntimeError(f"pod create: {status} {str(body)[:300]}")
            created[pod["metadata"]["name"]] = time.time()

    await asyncio.gather(*(worker() for _ in range(api.concurrency)))


async def one_round(
    api: Api, schedulers: Schedulers, service: Service, profile: str, label: str, count: int,
    timeout: float,
) -> dict[str, Any]:  # fmt: skip
    _, listing = await api.call("GET", PODS, params={"labelSelector": f"round={label}"})
    bound: dict[str, float] = {}
    watch = asyncio.create_task(
        watch_bound(api, label, listing["metadata"]["resourceVersion"], count, bound)
    )
    created: dict[str, float] = {}
    scheduler = PROFILES[profile]
    pods = [pod_object(f"{label}-{i:05d}", scheduler, label) for i in range(count)]
    await create_pods(api, pods, created)
    before = service_figures(service)
    started = time.time()
    await asyncio.to_thread(schedulers.start, profile, service.url)
    ready = time.time()
    try:
        await asyncio.wait_for(watch, timeout)
    except TimeoutError:
        say(f"{label}: {len(bound)} of {count} bound in {timeout} s")
    result: dict[str, Any] = {"profile": profile, "pods": count, "bound": len(bound)}
    if bound:
        first, last = min(bound.values()), max(bound.values())
        result["scheduler_ready_s"] = round(ready - started, 2)
        result["first_bind_after_ready_s"] = round(first - ready, 2)
        result["bind_span_s"] = round(last - first, 2)
        result["pods_per_s"] = round((len(bound) - 1) / (last - first), 1) if last > first else None
        result["create_to_bound_s"] = summary([bound[n] - created[n] for n in bound])
    result["scheduler"] = await asyncio.to_thread(schedulers.figures, profile)
    await asyncio.to_thread(schedulers.stop, profile)
    if profile != "default":
        result["extender"] = extender_share(before, service_figures(service))
    # Gone at once (no kubelet confirms a graceful deletion); the ledger releases them.
    await api.call("DELETE", PODS, {"gracePeriodSeconds": 0}, {"labelSelector": f"round={label}"})
    return result


def released(service: Service, before: dict[str, float], count: int, timeout: float) -> float:
    """Seconds until the service has released ``count`` more holdings, then quiet writes."""
    started = time.monotonic()

    def total(figures: dict[str, float]) -> float:
        return sum(v for k, v in figures.items() if k.startswith("nodeledger_releases_total"))

    while time.monotonic() - started < timeout:
        if total(service_figures(service)) - total(before) >= count:
            break
        time.sleep(0.5)
    last, last_change = service.counter(WRITES), time.monotonic()
    while time.monotonic() - last_change < 5 and time.monotonic() - started < timeout:
        time.sleep(1)
        if (now := service.counter(WRITES)) != last:
            last, last_change = now, time.monotonic()
    return round(time.monotonic() - started, 1)


def aggregate(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for profile in PROFILES:
        mine = [r for r in rounds if r["profile"] == profile and r.get("pods_per_s")]
        if not mine:
            continue
        out[profile] = {
            "pods_per_s": round(median(r["pods_per_s"] for r in mine), 1),
            "pods_per_s_rounds": [r["pods_per_s"] for r in mine],
            "create_to_bound_p50_s": round(median(r["create_to_bound_s"]["p50"] for r in mine), 2),
            "create_to_bound_p99_s": round(median(r["create_to_bound_s"]["p99"] for r in mine), 2),
        }
    for profile in NODELEDGER_PROFILES:
        if "default" in out and profile in out:
            d, n = out["default"], out[profile]
            suffix = "" if profile == "nodeledger" else f"_{profile}"
            out[f"ratio_pods_per_s{suffix}"] = round(n["pods_per_s"] / d["pods_per_s"], 3)
            ratio = n["create_to_bound_p99_s"] / d["create_to_bound_p99_s"]
            out[f"ratio_p99{suffix}"] = round(ratio, 3)
    return out


def measure(
    nodes: int, plane: ControlPlane, api: Api, url: str, args: argparse.Namespace
) -> dict[str, Any]:
    say(f"{nodes} nodes: loading")
    have = api.run(lambda a: a.count("/api/v1/nodes"))
    names = [node_name(i) for i in range(have, nodes)]
    result: dict[str, Any] = {"nodes": nodes, "pods_per_round": args.pods}
    if names:
        result["load"] = api.run(
            lambda a: create_all(a, "nodes", "/api/v1/nodes", map(node_object, names))
        )
    logs = RUNDIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # The chart's default: placeholder pods (none is made here: Slurm is off, so the
    # ledger keeps nothing from pods beyond them); the extender profiles ignore them.
    env = {"NODELEDGER_KUBE_PLACEHOLDERS": "true"}
    env |= dict(kv.split("=", 1) for kv in args.service_env)
    code = Path(args.service_code)
    # The first start writes every GenericNode's status: hurried, and waited for, so that
    # it does not load the API server during the rounds; they run on a restart with the
    # site's default status rate.
    qps = str(args.cold_status_qps)
    cold_env = {**env, "NODELEDGER_KUBE_STATUS_QPS": qps, "NODELEDGER_KUBE_STATUS_BURST": qps}
    cold = Service(url, plane.kubeconfig, free_port(), logs / f"cold-{nodes}.log", cold_env, code)
    cold.start()
    try:
        cold.wait("synced", cold.synced, args.ready_timeout)
        result["cold_start_synced_s"] = round(time.monotonic() - cold.started, 1)
        released(cold, service_figures(cold), 0, nodes / args.cold_status_qps + 120)
    finally:
        cold.stop()
    service = Service(url, plane.kubeconfig, free_port(), logs / f"service-{nodes}.log", env, code)
    schedulers = Schedulers(plane, args.port_base)
    service.start()
    try:
        service.wait("synced", service.synced, args.ready_timeout)
        result["service_synced_s"] = round(time.monotonic() - service.started, 1)
        released(service, service_figures(service), 0, 120)
        rounds = []
        for k in range(args.rounds):
            for profile in args.profiles.split(","):
                label = f"r{nodes}-{k}-{profile}"
                say(f"{nodes} nodes: round {k} {profile}")
                before = service_figures(service)
                r = api.run(partial(one_round, schedulers=schedulers, service=service,
                                    profile=profile, label=label, count=args.pods,
                                    timeout=args.round_timeout))  # fmt: skip
                r["released_s"] = released(service, before, r["bound"], 300)
                print(json.dumps(r), file=sys.stderr, flush=True)
                rounds.append(r)
        result["rounds"] = rounds
        result["summary"] = aggregate(rounds)
    finally:
        for profile in PROFILES:
            schedulers.stop(profile)
        service.stop()
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--nodes", default="500,5000", help="sizes, ascending (e.g. 500,5000,15000)")
    add("--pods", type=int, default=1000, help="pods per round")
    add("--rounds", type=int, default=2, help="rounds per profile, alternated")
    add("--keep", action="store_true", help="leave the control plane and PostgreSQL up")
    add("--cold-status-qps", type=float, default=500.0, help="status writes/s, first start")
    add("--ready-timeout", type=float, default=1800.0)
    add("--round-timeout", type=float, default=600.0)
    add("--concurrency", type=int, default=32, help="API requests in flight")
    add("--port-base", type=int, default=24379)
    add("--profiles", default="default,placeholders", help=f"alternated, of {','.join(PROFILES)}")
    add("--service-code", default=str(REPO), help="the checkout whose app is measured")
    add("--service-env", action="append", default=[], metavar="KEY=VALUE",
        help="one more environment variable of the service (e.g. a setting tried)")  # fmt: skip
    args = parser.parse_args(argv)
    sizes = sorted(int(n) for n in args.nodes.split(","))

    # A SIGTERM (timeout, kill) unwinds like ^C: the finally blocks stop what was started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    RUNDIR.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(RUNDIR, args.port_base)
    say("control plane up")
    plane.up()
    plane.kubectl("apply", "-f", str(CRD))
    plane.kubectl("wait", "--for=condition=Established", "crd/genericnodes.nodeledger.io")
    api = Api(plane.kubeconfig, args.concurrency)
    api.run(lambda a: a.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}))
    # Pods an interrupted run left behind (its rounds' names come again).
    api.run(lambda a: a.call("DELETE", PODS, {"gracePeriodSeconds": 0}))
    pg = postgres("up")
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "service_env": args.service_env,
        "service_code": args.service_code,
        "sizes": {},
    }
    try:
        with postgres_database(pg) as url:
            for nodes in sizes:
                report["sizes"][str(nodes)] = measured = measure(nodes, plane, api, url, args)
                print(json.dumps(measured["summary"]), file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            plane.down()
            postgres("down")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
