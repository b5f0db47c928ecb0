"""The Kubernetes headroom (issue 22) off and on, side by side in one run against a real
Slurm cluster: what it saves admissions and what it costs Slurm.

Two `nodeledger serve` processes with the Slurm integration on, one without a headroom
("off"), one with NODELEDGER_SLURM_HEADROOM_* set ("on"). A Slurm node belongs to one of
them at a time (both would push its counts): the bench hands nodes over by creating and
deleting the ledger's node, and puts Slurm's counts back in between. Prints one JSON
object; latencies are p50/p99 in ms, each with its ratio to the raw node update measured in
the same run:

- raw_node_update_ms: one POST /node/{name} straight to slurmrestd (the floor);
- single: POST /v1/admissions one after the other, off on n1 and on on n2 (raw updates on
  n3), interleaved round by round in a rotating order with the profile's references;
  pods accumulate on the node and are released all together once ``--fill`` are held
  (releases timed too). With the headroom on, split by what each admission's ADMITTED
  event says: confirmed inside the headroom (no Slurm call) or through Slurm;
- burst: ``--burst-pods`` pods spread over ``--nodes`` Slurm nodes n1..nN (default: every
  node of the cluster; the issue's burst is 200 pods over 20 nodes, a cluster brought up
  with NODELEDGER_SLURM_NODES=20), submitted
  concurrently (``--concurrency`` requests in flight), off and on alternately; "cold" on
  nodes just handed to the service (no headroom yet), then "warm" once they are released
  (the headroom kept, as within its idle time);
- slurm_cost: Slurm CPU- and MiB-seconds withheld beyond what pods hold, per node from the
  service's events, and jobs that pended only because of the headroom (``--jobs`` probes);
- profile: where a within-headroom admission's time goes: the service's own phase
  timers, GET /healthz (the HTTP floor) and the same admissions on a third service with
  the Slurm integration off (ledger only);
- targets: the issue's (within-headroom p50 and burst against the raw update p50, their
  bounds in bench/scenarios.toml) next to what the run measured.

    [NODELEDGER_SLURM_NODES=20] python -m bench.headroom [--samples 300] [--rounds 10]
        [--burst-pods 200] [--nodes N] [--bursts 2] [--jobs 3] [--slurm 26.05]

Needs the node_features plugin (Slurm >= 25.11 refuses the headroom's path without it): the
test cluster loads it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

import aiohttp

from bench._fixtures import (
    NODE_CPUS,
    NODE_MEMORY_MIB,
    REST_API,
    Service,
    SlurmCluster,
    cluster,
    headroom_services,
    pod,
    raw_updates,
    release_all,
    service_arguments,
    wait_until,
)
from bench._scenarios import threshold
from bench._stats import against, interleaved, summary, timed

CONFIGS = ("off", "on")
SINGLE_NODE = {"off": "n1", "on": "n2"}
RAW_NODE = "n3"  # raw updates here while n1 and n2 take pods
JOB_NODE = "n3"
LEDGER_NODE = "l1"  # the ledger-only service's node: no Slurm node behind it
MIB = 1024 * 1024

Samples = dict[str, list[float]]


# ---------------------------------------------------------------------------- figures


def by_path(samples: list[tuple[str, float]], within: dict[str, bool], raw: list[float]) -> Any:
    """Admission latencies overall and split by the path each took (its ADMITTED event)."""
    inside = [ms for uid, ms in samples if within.get(uid, False)]
    slurm = [ms for uid, ms in samples if not within.get(uid, False)]
    return {
        "overall": against([ms for _, ms in samples], raw),
        "within_headroom": against(inside, raw),
        "through_slurm": against(slurm, raw),
        "share_without_slurm_call": round(len(inside) / len(samples), 3) if samples else 0,
    }


# ---------------------------------------------------------------------------- metrics


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


# ---------------------------------------------------------------------------- single admissions


class Filler:
    """Admits pods on one node of a service one after the other, each timed; once ``fill``
    are held, releases them all (each release timed) before the next admission."""

    def __init__(
        self, service: Service, node: str, prefix: str, fill: int, cpu: str, memory: str
    ) -> None:
        self.service, self.node, self.prefix, self.fill = service, node, prefix, fill
        self.cpu, self.memory = cpu, memory
        self.admitted: list[tuple[str, float]] = []
        self.held = 0

    def admit(self, count: int) -> Samples:
        release_ms: list[float] = []
        client = self.service.client
        for _ in range(count):
            if self.held >= self.fill:
                release_ms += release_all(client, self.node)
                self.held = 0
            uid = f"{self.prefix}-{len(self.admitted)}"
            body = pod(self.node, uid, self.cpu, self.memory)
            ms = timed(lambda b=body: client.post("/v1/admissions", json=b).raise_for_status())
            self.admitted.append((uid, ms))
            self.held += 1
        return {"admission_ms": [ms for _, ms in self.admitted[-count:]], "release_ms": release_ms}


# ---------------------------------------------------------------------------- bursts


async def _burst(
    url: str, bodies: list[dict[str, Any]], concurrency: int
) -> tuple[float, list[tuple[str, float, int]]]:
    """Every body admitted concurrently, ``concurrency`` in flight: the wall seconds and
    (uid, ms, HTTP status) per pod. aiohttp: far less client CPU than threads of httpx on
    a machine of two cores the service shares."""
    results: list[tuple[str, float, int]] = []
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def admit(body: dict[str, Any]) -> None:
            async with gate:
                t0 = time.perf_counter()
                async with session.post(f"{url}/v1/admissions", json=body) as response:
                    await response.read()
                ms = (time.perf_counter() - t0) * 1000
                results.append((body["holder"]["uid"], ms, response.status))

        started = time.perf_counter()
        await asyncio.gather(*(admit(b) for b in bodies))
        return time.perf_counter() - started, results


async def _release(url: str, uids: list[str], concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def release(uid: str) -> None:
            async with gate, session.delete(f"{url}/v1/admissions/{uid}") as response:
                await response.read()

        started = time.perf_counter()
        await asyncio.gather(*(release(u) for u in uids))
        return time.perf_counter() - started


async def _raw_burst(
    slurm: SlurmCluster, nodes: list[str], count: int, concurrency: int
) -> tuple[float, list[float]]:
    """``count`` raw node updates over ``nodes`` at once, ``concurrency`` in flight: what
    slurmrestd and slurmctld do with a burst of the floor itself."""
    headers = {"X-SLURM-USER-NAME": slurm.user, "X-SLURM-USER-TOKEN": slurm.token}
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    samples: list[float] = []
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def update(i: int) -> None:
            node = nodes[i % len(nodes)]
            full = SlurmCluster.full_gres(node)
            body = {"gres": full.replace("k8scpu:16", f"k8scpu:{16 - i // len(nodes) % 2}")}
            url = f"{slurm.url}/slurm/{REST_API}/node/{node}"
            async with gate:
                t0 = time.perf_counter()
                async with session.post(url, json=body) as response:
                    await response.read()
                    response.raise_for_status()
                samples.append((time.perf_counter() - t0) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(update(i) for i in range(count)))
        return time.perf_counter() - started, samples


@dataclass
class Burst:
    config: str
    kind: str  # cold | warm
    wall_s: float
    release_wall_s: float
    results: list[tuple[str, float, int]]


def burst(
    service: Service, nodes: list[str], prefix: str, args: argparse.Namespace, kind: str
) -> Burst:
    bodies = [
        pod(nodes[i % len(nodes)], f"{prefix}-{i}", args.burst_cpu, args.burst_memory)
        for i in range(args.burst_pods)
    ]
    wall, results = asyncio.run(_burst(service.url, bodies, args.concurrency))
    admitted = [uid for uid, _, status in results if status in (200, 201)]
    release_wall = asyncio.run(_release(service.url, admitted, args.concurrency))
    for node in nodes:  # none left behind (a release that failed)
        release_all(service.client, node)
    return Burst(service.name, kind, wall, release_wall, results)


def burst_figures(
    bursts: list[Burst], within: dict[str, bool], raw: list[float], raw_burst: list[float]
) -> Any:
    figures: dict[str, Any] = {}
    for b in bursts:
        entry = figures.setdefault(b.config, {}).setdefault(
            b.kind, {"wall_s": [], "release_wall_s": [], "samples": [], "statuses": Counter()}
        )
        entry["wall_s"].append(round(b.wall_s, 3))
        entry["release_wall_s"].append(round(b.release_wall_s, 3))
        entry["samples"] += [(uid, ms) for uid, ms, status in b.results if status in (200, 201)]
        entry["statuses"].update(str(status) for _, _, status in b.results)
    for config in figures.values():
        for kind, entry in config.items():
            samples = entry.pop("samples")
            pods = len(samples) / len(entry["wall_s"])
            wall = statistics.median(entry["wall_s"])
            paths = by_path(samples, within, raw)
            overall = paths["overall"]
            config[kind] = {
                **entry,
                "statuses": dict(entry["statuses"]),
                "admissions_per_s": round(pods / wall, 1),
                "wall_ms_per_pod": round(wall * 1000 / pods, 2),
                "wall_ms_per_pod_to_raw_update_p50": round(
                    wall * 1000 / pods / statistics.median(raw), 2
                ),
                **paths,
                "overall_p50_to_raw_burst_p50": round(
                    overall["p50"] / statistics.median(raw_burst), 2
                ),
            }
    return figures


# ---------------------------------------------------------------------------- jobs


def squeue(slurm: SlurmCluster, *args: str) -> list[list[str]]:
    out = slurm.run("squeue", "-h", *args)
    return [line.split("|") for line in out.splitlines() if line.strip()]


def job_probes(
    service: Service, slurm: SlurmCluster, args: argparse.Namespace, prefix: str
) -> list[dict[str, Any]]:
    """``args.jobs`` trials on JOB_NODE, the service's only node, while batch jobs fill the
    other nodes: a few more pods each time, then a job sized to fit what pods leave there
    (whole cores), which the headroom, withheld on top, does not leave. Submitted twice:
    pinned to the node (-w) and free to go anywhere (only JOB_NODE has room); for each,
    whether sbatch took it, whether it started within ``args.job_wait`` seconds, its squeue
    reason if not, and whether it would have fit the node's CPUs minus pods and other
    running jobs."""
    trials = []
    held = 0
    for t in range(args.jobs):
        for _ in range(args.job_pods):
            uid = f"{prefix}-{held}"
            body = pod(JOB_NODE, uid, args.pod_cpu, args.pod_memory)
            service.client.post("/v1/admissions", json=body).raise_for_status()
            held += 1
        node = service.client.get(f"/v1/nodes/{JOB_NODE}").json()
        pods_cpus = math.ceil(node["held_by_kubernetes"]["cpu_millis"] / 1000)
        running = squeue(slurm, "-w", JOB_NODE, "-t", "R", "-o", "%C")
        others = sum(int(row[0]) for row in running)
        cpus = (NODE_CPUS - pods_cpus - others) // 2 * 2  # whole cores of two threads
        for how, where in (("pinned", ["-w", JOB_NODE]), ("anywhere", [])):
            trials.append(
                {
                    "trial": t,
                    "submitted": how,
                    "pods_cpus_slurm_units": pods_cpus,
                    "slurm_k8scpu_at_submit": slurm.k8s_counts(JOB_NODE)["k8scpu"],
                    "job_cpus": cpus,
                    **probe(slurm, [*where, "-c", str(cpus)], args.job_wait),
                    "would_fit_without_headroom": NODE_CPUS - pods_cpus - others >= cpus,
                }
            )
    release_all(service.client, JOB_NODE)
    return trials


def probe(slurm: SlurmCluster, how: list[str], wait: float) -> dict[str, str]:
    """Submit a job (``how``), watch it for up to ``wait`` seconds, cancel it."""
    try:
        job = slurm.sbatch(*how, "--mem=100", "--wrap", "sleep 300")
    except RuntimeError as refused:
        return {"state": "REFUSED", "reason": str(refused).rsplit("error: ", 1)[-1].strip()}
    deadline = time.monotonic() + wait
    state, reason, node = "", "", ""
    while time.monotonic() < deadline:
        rows = squeue(slurm, "-j", job, "-o", "%T|%r|%N")
        state, reason, node = rows[0] if rows else ("GONE", "", "")
        if state == "RUNNING":
            break
        time.sleep(0.1)
    slurm.scancel(job)
    wait_until(lambda: not squeue(slurm, "-j", job, "-o", "%T"), 30, what="job gone")
    return {"state": state, "reason": reason, "node": node}


def running(slurm: SlurmCluster, job: str) -> bool:
    return slurm.job_state(job) == "RUNNING"


@contextmanager
def blockers(slurm: SlurmCluster, nodes: list[str]) -> Iterator[None]:
    """A batch job filling each of ``nodes``."""
    jobs = [slurm.sbatch("-w", n, "-c", str(NODE_CPUS), "--mem=100", "--wrap", "sleep 600")
            for n in nodes]  # fmt: skip
    try:
        for job in jobs:
            wait_until(partial(running, slurm, job), 30, what="blocker runs")
        yield
    finally:
        slurm.scancel(*jobs)
        wait_until(lambda: not squeue(slurm, "-o", "%i"), 30, what="blockers gone")


def jobs_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    def pended(t: dict[str, Any]) -> bool:
        # BadConstraints: a pinned job whose node's k8s count fell below its request after
        # sbatch took it (a refill push withheld more meanwhile).
        reasons = ("Resources", "BadConstraints")
        return (
            t["state"] == "PENDING"
            and (t["reason"] in reasons or "GRES" in t["reason"].upper())
            and t["would_fit_without_headroom"]
        )

    summary: dict[str, Any] = {}
    for how in ("pinned", "anywhere"):
        mine = [t for t in trials if t["submitted"] == how]
        summary[how] = {
            "jobs": len(mine),
            "started": sum(t["state"] == "RUNNING" for t in mine),
            "refused_at_submission": sum(t["state"] == "REFUSED" for t in mine),
            "pended_only_because_of_headroom": sum(pended(t) for t in mine),
        }
    return {**summary, "trials": trials}


# ---------------------------------------------------------------------------- Slurm's cost


def _time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def withheld_intervals(events: list[dict[str, Any]], end: float) -> list[dict[str, Any]]:
    """Per node and time the service owned it (created .. deleted in its ledger): seconds
    owned and, integrated over them, what Slurm withheld (the last push's ``withheld``,
    nothing before the first: the bench put full counts back) beyond what pods held:
    exactly (in CPU- and MiB-seconds) and beyond pods rounded up to Slurm's units (what
    the service withholds without a headroom: the headroom's own share), each clamped at
    zero while a push lags an admission; and the pods' own CPU-seconds."""
    owned: dict[str, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []

    def advance(state: dict[str, Any], now: float) -> None:
        dt = now - state["at"]
        pods_m, pods_b = state["pods_m"], state["pods_b"]
        w_cpus, w_mib = state["w_cpus"], state["w_mib"]
        state["cpu_s"] += dt * max(0.0, w_cpus - pods_m / 1000)
        state["mib_s"] += dt * max(0.0, w_mib - pods_b / MIB)
        state["headroom_cpu_s"] += dt * max(0, w_cpus - math.ceil(pods_m / 1000))
        state["headroom_mib_s"] += dt * max(0, w_mib - math.ceil(pods_b / MIB))
        state["pods_cpu_s"] += dt * pods_m / 1000
        state["at"] = now

    def close(node: str, now: float) -> None:
        state = owned.pop(node)
        advance(state, now)
        done.append(
            {
                "node": node,
                "start": state["start"],
                "owned_s": now - state["start"],
                **{
                    k: state[k]
                    for k in ("cpu_s", "mib_s", "headroom_cpu_s", "headroom_mib_s", "pods_cpu_s")
                },
            }
        )

    for e in events:
        node, at, kind = e["node"], _time(e["at"]), e["kind"]
        if node is None:
            continue
        if kind == "node_created":
            owned[node] = {
                "start": at,
                "at": at,
                **dict.fromkeys(("pods_m", "pods_b", "w_cpus", "w_mib"), 0),
                **dict.fromkeys(
                    ("cpu_s", "mib_s", "headroom_cpu_s", "headroom_mib_s", "pods_cpu_s"), 0.0
                ),
            }
            continue
        state = owned.get(node)
        if state is None:
            continue
        advance(state, at)
        if kind == "node_deleted":
            close(node, at)
        elif kind in ("admitted", "released") and e["holder_kind"] == "pod":
            sign = 1 if kind == "admitted" else -1
            state["pods_m"] += sign * e["amounts"]["cpu_millis"]
            state["pods_b"] += sign * e["amounts"]["memory_bytes"]
        elif kind == "slurm_pushed":
            state["w_cpus"] = e["details"]["withheld"]["cpus"]
            state["w_mib"] = e["details"]["withheld"]["memory_mb"]
    for node in list(owned):
        close(node, end)
    return done


def cost_summary(intervals: list[dict[str, Any]]) -> dict[str, float]:
    owned = sum(i["owned_s"] for i in intervals)
    total = {
        k: sum(i[k] for i in intervals)
        for k in ("cpu_s", "mib_s", "headroom_cpu_s", "headroom_mib_s", "pods_cpu_s")
    }
    return {
        "node_seconds_owned": round(owned, 1),
        "cpu_s_withheld_beyond_pods": round(total["cpu_s"], 1),
        "mib_s_withheld_beyond_pods": round(total["mib_s"]),
        "headroom_cpu_s": round(total["headroom_cpu_s"], 1),
        "headroom_mib_s": round(total["headroom_mib_s"]),
        "pods_cpu_s": round(total["pods_cpu_s"], 1),
        "mean_headroom_cpus_per_owned_node": round(total["headroom_cpu_s"] / owned, 2)
        if owned
        else 0,
    }


# ---------------------------------------------------------------------------- profile


def profile(
    before: dict[str, float],
    after: dict[str, float],
    samples: list[tuple[str, float]],
    within: dict[str, bool],
) -> dict[str, Any]:
    """Where the admissions' time went: the client's mean next to the service's own phase
    timers (histogram sums over the same admissions; the ledger phase of an admission
    through Slurm is its hold plus its confirmation)."""
    d = delta(after, before)
    count = d.get('nodeledger_admission_duration_seconds_count{phase="ledger"}', 0)
    ledger_s = d.get('nodeledger_admission_duration_seconds_sum{phase="ledger"}', 0)
    slurm_n = d.get('nodeledger_admission_duration_seconds_count{phase="slurm"}', 0)
    slurm_s = d.get('nodeledger_admission_duration_seconds_sum{phase="slurm"}', 0)
    inside = [ms for uid, ms in samples if within.get(uid)]
    requests = {
        k.split('endpoint="')[1].split('"')[0]: int(v)
        for k, v in d.items()
        if k.startswith("nodeledger_slurm_request_duration_seconds_count")
    }
    return {
        "admissions": int(count),
        "client_mean_ms": round(statistics.fmean(ms for _, ms in samples), 2),
        "client_mean_ms_within_headroom": round(statistics.fmean(inside), 2) if inside else None,
        "service_ledger_phase_mean_ms": round(ledger_s / count * 1000, 2) if count else None,
        "service_slurm_phase_mean_ms": round(slurm_s / slurm_n * 1000, 2) if slurm_n else None,
        "admissions_with_slurm_phase": int(slurm_n),
        "within_headroom_metric": int(d.get("nodeledger_admissions_within_headroom_total", 0)),
        "slurm_requests": requests,
        "pushes": {
            k.split('reason="')[1].split('"')[0]: int(v)
            for k, v in d.items()
            if k.startswith("nodeledger_slurm_pushes_total")
        },
    }


# ---------------------------------------------------------------------------- the run


def targets(
    single: list[tuple[str, float]], within: dict[str, bool], raw: list[float], bursts: Any
) -> dict[str, Any]:
    """The issue's targets (bench/scenarios.toml, where `python -m bench headroom` checks
    them) next to what this run measured (ratios to the raw update p50)."""
    inside = [ms for uid, ms in single if within.get(uid)]
    ratio = round(statistics.median(inside) / statistics.median(raw), 2) if inside else None
    on = bursts.get("on", {})
    per_admission = {k: v["overall"].get("to_raw_update_p50") for k, v in on.items()}
    per_pod = {k: v["wall_ms_per_pod_to_raw_update_p50"] for k, v in on.items()}
    return {
        "on_single_within_headroom_p50": {
            "target": threshold("headroom", "on_single_within_headroom_p50").bound,
            "measured": ratio,
        },
        "on_burst_overall_p50": {
            "target": threshold("headroom", "on_burst_overall_p50").bound,
            "measured_per_admission": per_admission,
            "measured_wall_per_pod": per_pod,
            "note": "per admission: each pod's own latency, which in a burst includes "
            "waiting behind the others in flight; wall per pod: the burst's wall time over "
            "its pods",
        },
    }


def alternate(r: int) -> tuple[str, ...]:
    """Off first in even rounds, on first in odd ones."""
    return CONFIGS if r % 2 == 0 else CONFIGS[::-1]


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="single admissions per config")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fill", type=int, default=24, help="pods held before all are released")
    parser.add_argument("--pod-cpu", default="250m")
    parser.add_argument("--pod-memory", default="256Mi")
    parser.add_argument("--burst-pods", type=int, default=200)
    parser.add_argument(
        "--nodes",
        type=int,
        help="burst nodes n1..nN (default: every node of the cluster, NODELEDGER_SLURM_NODES)",
    )
    parser.add_argument("--bursts", type=int, default=2, help="cold + warm bursts per config")
    parser.add_argument("--concurrency", type=int, default=16, help="burst requests in flight")
    parser.add_argument("--burst-cpu", default="100m")
    parser.add_argument("--burst-memory", default="128Mi")
    parser.add_argument("--jobs", type=int, default=3, help="job probes per config")
    parser.add_argument("--job-pods", type=int, default=4, help="pods added per job probe")
    parser.add_argument("--job-wait", type=float, default=6.0, help="seconds for a job to start")
    service_arguments(parser, idle_seconds=3600.0)
    return parser


@dataclass
class Run:
    """One run's settings and what its three phases measured, for the report."""

    args: argparse.Namespace
    slurm: SlurmCluster
    nodes: list[str]  # the burst's
    started: float = field(default_factory=time.monotonic)
    load_start: list[float] = field(default_factory=lambda: [round(x, 2) for x in os.getloadavg()])
    single: dict[str, Filler] = field(default_factory=dict)
    samples: dict[str, Samples] = field(default_factory=dict)
    before: dict[str, dict[str, float]] = field(default_factory=dict)  # metrics
    after: dict[str, dict[str, float]] = field(default_factory=dict)
    bursts: list[Burst] = field(default_factory=list)
    raw_burst: list[float] = field(default_factory=list)
    raw_burst_walls: list[float] = field(default_factory=list)
    jobs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    phase_start: dict[str, float] = field(default_factory=dict)
    end: float = 0.0
    within: dict[str, dict[str, bool]] = field(default_factory=dict)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def single_admissions(run: Run, svc: dict[str, Service]) -> None:
    """Off on n1, on on n2, the ledger-only service on its own node, raw updates on n3 and
    the HTTP floor, interleaved round by round."""
    args, slurm = run.args, run.slurm
    run.phase_start["single"] = time.time()
    for name in CONFIGS:
        svc[name].take([SINGLE_NODE[name]])
        # Unmeasured: connections, caches, the first sync (and on: the headroom).
        Filler(svc[name], SINGLE_NODE[name], f"warm-{name}", 3, "100m", "100Mi").admit(3)
        release_all(svc[name].client, SINGLE_NODE[name])
        run.single[name] = Filler(
            svc[name], SINGLE_NODE[name], f"s-{name}", args.fill, args.pod_cpu, args.pod_memory
        )
    svc["ledger"].take([LEDGER_NODE])
    run.single["ledger"] = Filler(
        svc["ledger"], LEDGER_NODE, "s-l", args.fill, args.pod_cpu, args.pod_memory
    )
    run.single["ledger"].admit(3)  # unmeasured, as above
    on = svc["on"].client
    run.before = {name: svc[name].metrics() for name in CONFIGS}
    run.samples = interleaved(
        args.rounds,
        max(1, args.samples // args.rounds),
        {
            "raw": lambda n: {"ms": raw_updates(slurm, RAW_NODE, n)},
            "off": run.single["off"].admit,
            "on": run.single["on"].admit,
            "ledger": run.single["ledger"].admit,
            "http": lambda n: {
                "ms": [timed(lambda: on.get("/healthz").raise_for_status()) for _ in range(n)]
            },
        },
    )
    run.after = {name: svc[name].metrics() for name in CONFIGS}
    for name in CONFIGS:
        svc[name].give_back([SINGLE_NODE[name]], slurm)


def bursts(run: Run, svc: dict[str, Service]) -> None:
    """Bursts over the burst's nodes, the configurations alternating, each round followed
    by a burst of raw updates."""
    args, slurm, nodes = run.args, run.slurm, run.nodes
    run.phase_start["burst"] = time.time()
    for r in range(args.bursts):
        for name in alternate(r):
            svc[name].take(nodes)
            for kind in ("cold", "warm"):
                run.bursts.append(burst(svc[name], nodes, f"b{r}-{name}-{kind}", args, kind))
            svc[name].give_back(nodes, slurm)
        wall, ms = asyncio.run(_raw_burst(slurm, nodes, args.burst_pods, args.concurrency))
        run.raw_burst_walls.append(wall)
        run.raw_burst += ms
        slurm.reset()


def jobs_beside_pods(run: Run, svc: dict[str, Service]) -> None:
    """Jobs beside pods: do they start with the headroom withheld too?"""
    slurm = run.slurm
    run.phase_start["jobs"] = time.time()
    with blockers(slurm, [n for n in slurm.nodes if n != JOB_NODE]):
        for name in CONFIGS:
            svc[name].take([JOB_NODE])
            run.jobs[name] = job_probes(svc[name], slurm, run.args, f"j-{name}")
            svc[name].give_back([JOB_NODE], slurm)


def measure(run: Run) -> None:
    """The three phases against the same three services, then the services' events."""
    try:
        with headroom_services(run.slurm, run.args) as svc:
            single_admissions(run, svc)
            bursts(run, svc)
            jobs_beside_pods(run, svc)
            run.end = time.time()
            run.within = {name: svc[name].within_headroom() for name in CONFIGS}
            run.events = {name: svc[name].events() for name in CONFIGS}
    finally:
        run.slurm.reset()


def slurm_costs(run: Run) -> dict[str, Any]:
    """Per configuration and phase: what Slurm was withheld beyond the pods."""
    phases = sorted(run.phase_start.items(), key=lambda p: p[1])

    def phase_of(at: float) -> str:
        return [name for name, start in phases if start <= at][-1]

    cost: dict[str, Any] = {}
    for name in CONFIGS:
        intervals = withheld_intervals(run.events[name], run.end)
        cost[name] = {
            phase: cost_summary([i for i in intervals if phase_of(i["start"]) == phase])
            for phase, _ in phases
        }
    return cost


def single_report(run: Run, raw: list[float]) -> dict[str, Any]:
    args = run.args
    return {
        "method": "one client (httpx), POST /v1/admissions one after the other; off on "
        f"n1, on on n2, raw updates on {RAW_NODE}, {args.rounds} rounds in a rotating "
        f"order; pods of {args.pod_cpu}/{args.pod_memory} accumulate, all released "
        f"once {args.fill} are held; path per pod from its ADMITTED event "
        "(details.within_headroom)",
        **{
            name: {
                "admission_ms": by_path(run.single[name].admitted, run.within[name], raw),
                "release_ms": against(run.samples[name].get("release_ms", []), raw),
            }
            for name in CONFIGS
        },
    }


def burst_report(run: Run, figures: dict[str, Any]) -> dict[str, Any]:
    args = run.args
    return {
        "method": f"{args.burst_pods} pods of {args.burst_cpu}/{args.burst_memory} "
        f"round-robin over {len(run.nodes)} nodes, all submitted at once with "
        f"{args.concurrency} in flight (aiohttp); cold: nodes just created in the "
        "ledger, no headroom yet; warm: right after the cold burst's pods were all "
        "released (the headroom kept); off and on alternate, "
        f"{args.bursts} of each; latency per pod, wall time per burst",
        "raw_node_update_burst": {
            "method": f"{args.burst_pods} POST /node/{{name}} over the same nodes, "
            f"{args.concurrency} in flight, after each round of bursts",
            "wall_s": [round(w, 3) for w in run.raw_burst_walls],
            **summary(run.raw_burst),
        },
        **figures,
    }


def jobs_report(run: Run) -> dict[str, Any]:
    args = run.args
    return {
        "method": f"the other nodes filled by batch jobs; on {JOB_NODE}, the service's "
        f"only node: {args.job_pods} more pods of {args.pod_cpu} per trial, then sbatch "
        "-c C --mem=100 with C the even CPUs (whole cores) the node's 16 leave beside pods "
        "(rounded up to whole CPUs) and other running jobs, once pinned (-w) and once "
        "free to go anywhere; each watched for "
        f"{args.job_wait:g} s (bf_interval=5) and cancelled. Pended by the headroom: "
        "PENDING with reason Resources (BadConstraints for a pinned one, or GRES) while "
        "it would have fit without it; a pinned job sbatch refuses outright is counted "
        "apart",
        **{name: jobs_summary(run.jobs[name]) for name in CONFIGS},
    }


def profile_report(run: Run, raw: list[float]) -> dict[str, Any]:
    return {
        "method": "single admissions' client-side mean next to the service's own "
        "nodeledger_admission_duration_seconds per phase (sums over the same "
        "admissions) and its slurmrestd requests; client mean - ledger phase = HTTP, "
        "FastAPI, the worker-thread hop and the client. Interleaved with the single "
        "admissions: http_floor, GET /healthz of the 'on' service (a sync endpoint: "
        "HTTP, FastAPI and one worker-thread hop, no database), and ledger_only, the "
        "same admissions on a third service with the Slurm integration off (one ledger "
        "transaction, no worker-thread hop)",
        "http_floor_ms": against(run.samples["http"]["ms"], raw),
        "ledger_only_admission_ms": against(run.samples["ledger"]["admission_ms"], raw),
        **{
            name: profile(
                run.before[name], run.after[name], run.single[name].admitted, run.within[name]
            )
            for name in CONFIGS
        },
    }


def report(run: Run) -> dict[str, Any]:
    """The run's figures: the JSON object the bench prints."""
    args, slurm = run.args, run.slurm
    raw = run.samples["raw"]["ms"]
    within = {**run.within["off"], **run.within["on"]}
    figures = burst_figures(run.bursts, within, raw, run.raw_burst)
    return {
        "slurm": f"{slurm.release} (real slurmctld + slurmrestd, JWT)",
        "database": "sqlite",
        "nodes": {
            "cluster": len(slurm.nodes),
            "burst": len(run.nodes),
            "names": run.nodes,
            "size": f"{NODE_CPUS} CPUs, {NODE_MEMORY_MIB} MiB",
            "how": "every one a registered slurmd (testenv/slurm/cluster.sh, "
            "NODELEDGER_SLURM_NODES; n3 has the GPUs), all on this host: the issue's burst "
            "is 200 pods over 20 nodes; single admissions use n1-n3, job probes n3 with "
            "every other node of the cluster blocked",
        },
        "headroom": {
            "cpu": args.headroom_cpu,
            "memory": args.headroom_memory,
            "idle_seconds": args.idle_seconds,
            "low_water": 0.5,  # the service's defaults: not set by the bench
            "grow_step": 1.0,
            "max_factor": 4.0,
        },
        "raw_node_update_ms": summary(raw),
        "single": single_report(run, raw),
        "burst": burst_report(run, figures),
        "slurm_cost": {
            "method": "per node, from the service's events: the last SLURM_PUSHED event's "
            "details.withheld (Slurm units: whole CPUs, MiB) minus the pods held (ADMITTED - "
            "RELEASED amounts), integrated over the time the service owned the node; "
            "'headroom_*' subtracts pods rounded up to Slurm's units instead (what is "
            "withheld without a headroom), so it is the headroom's own share; clamped at 0 "
            "while a push lags an admission (off is above 0 only while a push lags a "
            "release)",
            **slurm_costs(run),
        },
        "jobs_pended_by_headroom": jobs_report(run),
        "profile": profile_report(run, raw),
        "targets": targets(run.single["on"].admitted, run.within["on"], raw, figures),
        "load_average": {"start": run.load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "seconds": round(time.monotonic() - run.started, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = arguments()
    args = parser.parse_args(argv)
    started, load_start = time.monotonic(), [round(x, 2) for x in os.getloadavg()]
    slurm = cluster(args.slurm)
    if args.nodes is not None and not 1 <= args.nodes <= len(slurm.nodes):
        parser.error(
            f"--nodes {args.nodes}: the cluster has {len(slurm.nodes)} nodes; "
            f"NODELEDGER_SLURM_NODES={args.nodes} brings it up with more"
        )
    slurm.reset()
    run = Run(args, slurm, list(slurm.nodes[: args.nodes]), started, load_start)
    measure(run)
    print(json.dumps(report(run), indent=2))


if __name__ == "__main__":
    main()
