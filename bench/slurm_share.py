"""Slurm users keep Slurm's behaviour (issue 31): Kubernetes pods racing `sbatch` jobs on
one 16-CPU Slurm node of a real cluster, the service's Kubernetes headroom off and on.

Two `nodeledger serve` processes with the Slurm integration on (bench.headroom.services):
"off" without a headroom, "on" with NODELEDGER_SLURM_HEADROOM_CPU/_MEMORY (default 2 and
4Gi). ``--rounds`` rounds of one side after the other, the first round in ``--order``, the
order swapped each round (whichever side runs second admits more pods: a warmer cluster),
with a seed of its own per round, the same for both sides. The side's service takes the
node n1 (bench.headroom.Service.take) and, for ``--phases`` phases of ``--phase-seconds`` each:

- pods: ``--workers`` workers each loop POST /v1/admissions of a pod of random size
  (``--pod-cpus``, ``--pod-memory-gi``) on n1; admitted (201): held a random
  ``--hold`` seconds, then DELETE /v1/admissions/{uid}; refused (409): a pause of
  ``--refused-pause`` seconds (a scheduler's retry) before the next. Counted per phase;
  admission latency p50/p99 in ms;
- jobs: one submitter keeps ``--queue`` of its jobs pending (a job pending over
  ``--stuck-seconds`` frees its slot: pinned jobs Slurm marked BadConstraints may pend
  for good; they are counted apart): `sbatch -w n1 -c K
  --mem=K*--job-mem-per-cpu --wrap 'sleep S'`, K in ``--job-cpus``, S in
  ``--job-seconds``; counted per phase of their submission: submitted, refused at submit
  (sbatch's stderr kept, e.g. "Requested node configuration is not available"), and per
  phase of their start: started (seen RUNNING or later through slurmrestd's job listing,
  polled every 0.25 s; start time from Slurm), with their queue wait;
- then the whole-node probe: job submission stops and the race's jobs are cancelled while
  the pods go on holding part of the node; `sbatch -w n1 --exclusive` (``--probe cpus``:
  `-c 16`) is submitted and watched ``--probe-watch`` seconds (refused or pending, and
  why); then the pod workers stop and every pod is released, and the probe measures how
  long after the last pod left the job starts (a refused probe is submitted again every
  ``--probe-retry`` seconds from then on), within ``--probe-wait`` seconds; with the
  service's headroom events meanwhile (given back: idle, or jobs waiting).
- with ``--delay-probes N``, in the first round, N more whole-node jobs, each submitted
  while two pods hold ``--delay-pod-cpus`` CPUs of NODE, and the seconds from the pods'
  release to the job seen running (p50/p99);
- with ``--jobs-queue`` (the default) both services run NODELEDGER_SLURM_JOBS_QUEUE (the
  ledger takes every node of the partition, so the job_submit plugin gives jobs the extra
  constraint): jobs wait (``Constraints``) instead of being refused at submit; with
  ``--no-jobs-queue`` they are refused, as at a site without extra_constraints.

The side's service then gives the node back (Slurm's counts as the cluster started).
Prints one JSON object: per round and side, pods admitted/refused and admission p50/p99,
jobs submitted/refused_at_submit/started per phase and in total, the probe; per round and
over all rounds (``total``), the ratio of jobs started with the headroom on to off (total
and per phase); the date, Slurm's version and the settings.

    python -m bench.slurm_share [--slurm 24.11] [--phases 3] [--phase-seconds 40]
        [--workers 6] [--queue 3] [--probe exclusive|cpus] [--order off,on]
        [--rounds 2] [--jobs-queue] [--delay-probes 20]

Against a cluster of one's own (e.g. /tmp/helper-env.sh's), export
NODELEDGER_SLURM_PORT_BASE (and NODELEDGER_CACHE, NODELEDGER_RUNDIR) as for cluster.sh:
the bench brings the cluster up itself (`cluster.sh up`, as bench.headroom does).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import httpx

from bench._fixtures import (
    NODE_CPUS,
    NODE_MEMORY_MIB,
    Service,
    SlurmCluster,
    cluster,
    headroom_services,
    pod,
    release_all,
    service_arguments,
    wait_until,
)
from bench._stats import percentile, summary

NODE = "n1"
SIDES = ("off", "on")
# A job's states (slurmrestd's job_state flags) that mean it started.
STARTED = frozenset({"RUNNING", "COMPLETING", "COMPLETED", "TIMEOUT", "SUSPENDED", "PREEMPTED"})
AMOUNT = re.compile(r"\d+(\.\d+)?(Gi|Mi)?( (cpu|memory|gpu))?")
FINAL = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"})


# ---------------------------------------------------------------------------- figures


def ratio(on: float, off: float) -> float | None:
    return round(on / off, 3) if off else None


@dataclass(frozen=True)
class Phases:
    """The race's phases: ``count`` of ``seconds`` each from ``start`` (wall clock)."""

    start: float
    count: int
    seconds: float

    @property
    def end(self) -> float:
        return self.start + self.count * self.seconds

    def of(self, at: float) -> int | None:
        """The phase of wall time ``at``; None outside the race."""
        if not self.start <= at < self.end:
            return None
        return int((at - self.start) // self.seconds)


# ---------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class Admission:
    at: float  # wall clock when sent
    status: int  # HTTP status; 0: no answer (a transport error)
    ms: float
    code: str = ""  # a refusal's error code


class PodWorkers:
    """``args.workers`` threads admitting, holding and releasing pods on NODE until
    ``stop``; every admission's result kept."""

    def __init__(self, url: str, args: argparse.Namespace, prefix: str, seed: int) -> None:
        self.url, self.args, self.prefix = url, args, prefix
        self.admissions: list[Admission] = []
        self.last_release = 0.0  # wall clock when the latest release was answered
        self.failed_releases = 0  # left to release_all
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, args=(w, seed + w), daemon=True)
            for w in range(args.workers)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Every worker done: its held pod, if any, released."""
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _work(self, worker: int, seed: int) -> None:
        rng = random.Random(seed)
        args = self.args
        with httpx.Client(base_url=self.url, timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                uid = f"{self.prefix}-w{worker}-{i}"
                i += 1
                cpus = rng.randint(*args.pod_cpus)
                memory = rng.randint(*args.pod_memory_gi)
                body = pod(NODE, uid, str(cpus), f"{memory}Gi")
                at, t0 = time.time(), time.perf_counter()
                try:
                    response = client.post("/v1/admissions", json=body)
                    status = response.status_code
                except httpx.HTTPError:
                    response, status = None, 0
                ms = (time.perf_counter() - t0) * 1000
                code = ""
                if response is not None and status >= 400:
                    code = str(response.json().get("code", ""))
                with self._lock:
                    self.admissions.append(Admission(at, status, ms, code))
                if status in (200, 201):
                    time.sleep(rng.uniform(*args.hold))
                    released = client.delete(f"/v1/admissions/{uid}").status_code == 200
                    with self._lock:
                        self.last_release = max(self.last_release, time.time())
                        self.failed_releases += not released
                else:
                    self._stop.wait(args.refused_pause)


def pod_figures(admissions: list[Admission], phases: Phases) -> dict[str, Any]:
    """Admitted/refused per phase and in total, and the admissions' latencies (the race's
    admissions only: sent within a phase)."""
    per_phase: list[Counter[str]] = [Counter() for _ in range(phases.count)]
    admitted_ms: list[float] = []
    refused_ms: list[float] = []
    codes: Counter[str] = Counter()
    others: Counter[str] = Counter()
    for a in admissions:
        phase = phases.of(a.at)
        if phase is None:
            continue
        if a.status in (200, 201):
            per_phase[phase]["admitted"] += 1
            admitted_ms.append(a.ms)
        elif a.status == 409:
            per_phase[phase]["refused"] += 1
            refused_ms.append(a.ms)
            codes[a.code] += 1
        else:
            per_phase[phase]["other"] += 1
            others[str(a.status)] += 1
    admitted = sum(c["admitted"] for c in per_phase)
    refused = sum(c["refused"] for c in per_phase)
    return {
        "admitted": admitted,
        "refused": refused,
        "admitted_share": round(admitted / (admitted + refused), 3) if admitted + refused else 0,
        "other_statuses": dict(others),
        "refusal_codes": dict(codes),
        "per_phase": [
            {"admitted": c["admitted"], "refused": c["refused"], "other": c["other"]}
            for c in per_phase
        ],
        "admission_ms": summary(admitted_ms + refused_ms),
        "admitted_ms": summary(admitted_ms),
        "refused_ms": summary(refused_ms),
    }


# ---------------------------------------------------------------------------- jobs


@dataclass
class Job:
    id: str
    cpus: int
    submitted_at: float  # wall clock
    state: str = "PENDING"
    started_at: float | None = None  # Slurm's start time (whole seconds)
    reasons: set[str] = field(default_factory=set)  # while pending

    @property
    def final(self) -> bool:
        return self.state in FINAL


def sbatch(slurm: SlurmCluster, *how: str) -> tuple[str | None, str]:
    """A job submitted (its id, "") or refused by sbatch (None, its stderr)."""
    try:
        return slurm.sbatch(*how), ""
    except RuntimeError as refused:  # cluster_sh's: "... failed:\n<stderr>"
        return None, str(refused).split("failed:\n", 1)[-1].strip()


def slurm_jobs(slurm: SlurmCluster) -> dict[str, dict[str, Any]]:
    """Every job slurmctld still lists (finished ones for MinJobAge), by id."""
    listing = slurm.rest("GET", "jobs/").raise_for_status().json()
    return {str(job["job_id"]): job for job in listing["jobs"]}


def job_states(job: dict[str, Any]) -> set[str]:
    state = job["job_state"]
    return set(state) if isinstance(state, list) else {str(state)}


class JobSubmitter:
    """One thread submitting jobs pinned to NODE, ``args.queue`` of them pending at most,
    and one following their states through slurmrestd."""

    def __init__(self, slurm: SlurmCluster, args: argparse.Namespace, seed: int) -> None:
        self.slurm, self.args = slurm, args
        self.jobs: dict[str, Job] = {}
        self.refused: list[tuple[float, int, str]] = []  # wall clock, CPUs, stderr
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop_submitting = threading.Event()
        self._stop_polling = threading.Event()
        self._submitter = threading.Thread(target=self._submit, daemon=True)
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def start(self) -> None:
        self._poller.start()
        self._submitter.start()

    def stop_submitting(self) -> None:
        self._stop_submitting.set()
        self._submitter.join()

    def cancel_and_stop(self) -> None:
        """The jobs not finished cancelled; polling stops once all are final."""
        with self._lock:
            live = [j.id for j in self.jobs.values() if not j.final]
        self.slurm.scancel(*live)
        wait_until(self._all_final, 60, interval=0.25, what="the race's jobs finished")
        self._stop_polling.set()
        self._poller.join()

    def _all_final(self) -> bool:
        with self._lock:
            return all(j.final for j in self.jobs.values())

    def _pending(self) -> int:
        """Jobs pending for less than ``args.stuck_seconds``: a job pending longer (a pinned
        job Slurm marked BadConstraints may pend for good) no longer holds a queue slot."""
        fresh = time.time() - self.args.stuck_seconds
        with self._lock:
            return sum(j.state == "PENDING" and j.submitted_at > fresh for j in self.jobs.values())

    def _submit(self) -> None:
        args = self.args
        while not self._stop_submitting.is_set():
            if self._pending() >= args.queue:
                self._stop_submitting.wait(0.1)
                continue
            cpus = self._rng.randint(*args.job_cpus)
            seconds = self._rng.randint(*args.job_seconds)
            at = time.time()
            job, stderr = sbatch(
                self.slurm, "-w", NODE, "-c", str(cpus),
                f"--mem={cpus * args.job_mem_per_cpu}", "--wrap", f"sleep {seconds}",
            )  # fmt: skip
            with self._lock:
                if job is None:
                    self.refused.append((at, cpus, stderr))
                else:
                    self.jobs[job] = Job(job, cpus, at)
            if job is None:  # no tight loop of refusals: as a pod refused, a pause
                self._stop_submitting.wait(args.refused_pause)

    def _poll(self) -> None:
        while not self._stop_polling.is_set():
            try:
                listed = slurm_jobs(self.slurm)
            except httpx.HTTPError:
                listed = {}
            with self._lock:
                for job in self.jobs.values():
                    if job.final or job.id not in listed:
                        continue
                    raw = listed[job.id]
                    states = job_states(raw)
                    if job.started_at is None and states & STARTED:
                        job.started_at = float(raw["start_time"]["number"])
                    if states & FINAL:
                        job.state = min(states & FINAL)
                    elif states & STARTED:
                        job.state = "RUNNING"
                    elif "PENDING" in states:
                        job.reasons.add(str(raw.get("state_reason") or ""))
            self._stop_polling.wait(0.25)


def job_figures(submitter: JobSubmitter, phases: Phases) -> dict[str, Any]:
    """Submitted and refused at submit per phase of their submission, started per phase
    of their start (Slurm's start time), queue waits, and what pending jobs waited for."""
    per_phase = [Counter[str]() for _ in range(phases.count)]
    waits: list[float] = []
    started_cpus = 0
    for job in submitter.jobs.values():
        if (phase := phases.of(job.submitted_at)) is not None:
            per_phase[phase]["submitted"] += 1
        if job.started_at is not None and (phase := phases.of(job.started_at)) is not None:
            per_phase[phase]["started"] += 1
            started_cpus += job.cpus
            waits.append(max(0.0, job.started_at - job.submitted_at))
    stderr: Counter[str] = Counter()
    refused_cpus: Counter[int] = Counter()
    for at, cpus, message in submitter.refused:
        if (phase := phases.of(at)) is not None:
            per_phase[phase]["refused_at_submit"] += 1
            stderr[message] += 1
            refused_cpus[cpus] += 1
    keys = ("submitted", "refused_at_submit", "started")
    total = {k: sum(c[k] for c in per_phase) for k in keys}
    reasons = Counter(r for job in submitter.jobs.values() for r in job.reasons if r != "None")
    stuck = [
        job
        for job in submitter.jobs.values()
        if phases.of(job.submitted_at) is not None
        and (job.started_at or phases.end) - job.submitted_at >= submitter.args.stuck_seconds
    ]
    return {
        **total,
        "started_cpus": started_cpus,
        "per_phase": [{k: c[k] for k in keys} for c in per_phase],
        "refused_stderr": dict(stderr),
        "refused_by_cpus": {str(k): v for k, v in sorted(refused_cpus.items())},
        "queue_wait_s": {
            "p50": round(statistics.median(waits), 1),
            "p99": round(percentile(waits, 99), 1),
            "n": len(waits),
        }
        if waits
        else {"n": 0},
        "jobs_pending_with_reason": dict(reasons),
        "jobs_pending_longer_than_stuck_seconds": {
            "jobs": len(stuck),
            "started_later": sum(j.started_at is not None for j in stuck),
            "reasons": dict(Counter(r for j in stuck for r in j.reasons if r != "None")),
        },
        "final_states": dict(Counter(job.state for job in submitter.jobs.values())),
    }


# ---------------------------------------------------------------------------- the probe


def node_view(service: Service) -> dict[str, Any]:
    node: dict[str, Any] = service.client.get(f"/v1/nodes/{NODE}").raise_for_status().json()
    return node


def held_cpu_millis(service: Service) -> int:
    return int(node_view(service)["held_by_kubernetes"]["cpu_millis"])


def headroom_target(service: Service) -> int:
    return int(node_view(service)["headroom"]["target"]["cpu_millis"])


def job_state(slurm: SlurmCluster, job: str) -> tuple[set[str], str]:
    raw = slurm.rest("GET", f"job/{job}").raise_for_status().json()["jobs"][0]
    return job_states(raw), str(raw.get("state_reason") or "")


def watch(
    slurm: SlurmCluster,
    job: str,
    seconds: float,
    until: Callable[[set[str]], bool],
    poll: float = 0.2,
) -> tuple[set[str], str, float | None]:
    """Poll the job's state for up to ``seconds``: its last states and reason, and the
    wall clock at which ``until`` first held (None: never)."""
    deadline = time.monotonic() + seconds
    while True:
        states, reason = job_state(slurm, job)
        if until(states):
            return states, reason, time.time()
        if time.monotonic() > deadline:
            return states, reason, None
        time.sleep(poll)


def whole_node_probe(
    service: Service, slurm: SlurmCluster, pods: PodWorkers, args: argparse.Namespace
) -> dict[str, Any]:
    """While pods hold part of NODE, a whole-node job; then the pods leave."""
    how = ["--exclusive"] if args.probe == "exclusive" else ["-c", str(NODE_CPUS)]
    command = ["-w", NODE, *how, "--wrap", "sleep 5"]
    wait_until(lambda: held_cpu_millis(service) > 0, 30, interval=0.05, what="pods held")
    began = time.time()
    node = node_view(service)
    result: dict[str, Any] = {
        "sbatch": " ".join(["sbatch", *command[:-1], "'sleep 5'"]),
        "at_submit": {
            "pods_cpu_millis": node["held_by_kubernetes"]["cpu_millis"],
            "headroom_target_cpu_millis": node["headroom"]["target"]["cpu_millis"],
            "slurm_k8s_counts": slurm.k8s_counts(NODE),
        },
    }
    job, stderr = sbatch(slurm, *command)
    if job is None:
        result["while_pods_held"] = {"outcome": "refused", "stderr": stderr}
    else:
        states, reason, ran = watch(slurm, job, args.probe_watch, lambda s: bool(s & STARTED))
        result["while_pods_held"] = {
            "outcome": "started" if ran is not None else "pending",
            "states": sorted(states),
            "reason": reason,
            "watched_s": args.probe_watch,
        }
    pods.stop()
    if release_all(service.client, NODE):  # a release that failed
        pods.last_release = time.time()
    left = pods.last_release
    result["pods_left"] = {
        "k8s_counts_then": slurm.k8s_counts(NODE),
        "headroom_target_cpu_millis": headroom_target(service),
        "failed_releases": pods.failed_releases,
    }
    attempts = 0
    while job is None and time.time() - left < args.probe_wait:
        attempts += 1
        job, stderr = sbatch(slurm, *command)
        if job is None:
            time.sleep(args.probe_retry)
    after: dict[str, Any] = {"resubmissions": attempts}
    if attempts:
        after["accepted_after_s"] = round(time.time() - left, 2) if job else None
        after["last_stderr"] = stderr if job is None else ""
    if job is not None:
        remaining = max(0.0, args.probe_wait - (time.time() - left))
        states, reason, ran = watch(slurm, job, remaining, lambda s: bool(s & STARTED))
        after["started_after_s"] = round(ran - left, 2) if ran is not None else None
        after["states"], after["reason"] = sorted(states), reason
        slurm.scancel(job)
    result["after_pods_left"] = {**after, "waited_at_most_s": args.probe_wait}
    since = headroom_events(service, began)
    result["headroom_events"] = {
        "grant_changes": sum(e["message"].startswith("headroom grant") for e in since),
        "target_changes": [
            {
                "s_after_pods_left": round(_at(e) - left, 2),
                "message": e["message"],
            }
            for e in since
            if not e["message"].startswith("headroom grant")
        ],
    }
    return result


def delay_probes(
    service: Service, slurm: SlurmCluster, args: argparse.Namespace, count: int
) -> dict[str, Any]:
    """``count`` times: pods hold ``args.delay_pod_cpus`` CPUs of NODE (two
    pods), a whole-node job is submitted (refused: submitted again every
    ``args.probe_retry`` s once the pods left), the pods leave, and the seconds from the
    last release to the job seen RUNNING (polled every 0.05 s) are kept."""
    how = ["--exclusive"] if args.probe == "exclusive" else ["-c", str(NODE_CPUS)]
    command = ["-w", NODE, *how, "--wrap", "sleep 30"]
    half = f"{args.delay_pod_cpus / 2:g}"
    delays: list[float] = []
    outcomes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for i in range(count):
        for p in (1, 2):
            # Refused while the previous job still completes on the node: admitted once it left.
            body = pod(NODE, f"d{i}-{p}", half)
            wait_until(partial(admitted, service, body), 60, interval=0.2, what="probe pod held")
        job, _ = sbatch(slurm, *command)
        if job is None:
            outcomes["refused"] += 1
        else:
            _, reason, ran = watch(slurm, job, 2.0, lambda s: bool(s & STARTED))
            outcomes["started" if ran is not None else "pending"] += 1
            reasons[reason] += 1
        release_all(service.client, NODE)
        left = time.time()
        while job is None and time.time() - left < args.probe_wait:
            time.sleep(args.probe_retry)
            job, _ = sbatch(slurm, *command)
        if job is not None:
            remaining = max(0.0, args.probe_wait - (time.time() - left))
            ran = watch(slurm, job, remaining, lambda s: bool(s & STARTED), poll=0.05)[2]
            if ran is not None:
                delays.append(ran - left)
            slurm.scancel(job)
            wait_until(partial(job_ended, slurm, job), 60, what=f"probe job {job} ended")
    return {
        "probes": count,
        "pods_hold_cpus": args.delay_pod_cpus,
        "while_pods_held": dict(outcomes),
        "pending_reasons": dict(reasons),
        "started": len(delays),
        "started_after_pods_left_s": summary(delays),
    }


def marked(slurm: SlurmCluster, nodes: list[str]) -> bool:
    """Every node's Extra carries the service's queue marker (NODELEDGER_SLURM_JOBS_QUEUE)."""
    return all('"nodeledger":1' in str(slurm.node(n).get("extra") or "") for n in nodes)


def admitted(service: Service, body: dict[str, Any]) -> bool:
    return service.client.post("/v1/admissions", json=body).status_code in (200, 201)


def job_ended(slurm: SlurmCluster, job: str) -> bool:
    """No longer running (a cancelled job may be COMPLETING a moment)."""
    return not job_state(slurm, job)[0] & (STARTED - FINAL)


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


def headroom_events(service: Service, since: float) -> list[dict[str, Any]]:
    """The service's headroom events on NODE from wall time ``since`` on."""
    return [
        e
        for e in service.events()
        if e["kind"] == "headroom" and e["node"] == NODE and _at(e) >= since
    ]


def event_kinds(events: list[dict[str, Any]]) -> dict[str, int]:
    """Headroom events counted by their message with the amounts left out."""
    return dict(Counter(AMOUNT.sub("#", e["message"]) for e in events))


# ---------------------------------------------------------------------------- a side


def side(
    name: str,
    service: Service,
    slurm: SlurmCluster,
    args: argparse.Namespace,
    seed: int,
    probes: int,
) -> dict[str, Any]:
    """The race on NODE for this side's service, then the probe; the node given back."""
    # Jobs wait only when every node of their partition is marked: the ledger takes them all.
    taken = list(slurm.nodes) if args.jobs_queue else [NODE]
    service.take(taken)
    # Unmeasured: the connection, the first sync step's look at the node, one pod.
    wait_until(lambda: node_view(service)["admissible"], 30, what=f"{NODE} admissible")
    if args.jobs_queue:  # else the plugin gives the race's first jobs no constraint
        wait_until(partial(marked, slurm, taken), 60, what="every node marked for the queue")
    service.client.post("/v1/admissions", json=pod(NODE, f"{name}-warm")).raise_for_status()
    release_all(service.client, NODE)
    pods = PodWorkers(service.url, args, f"{name}-pod", seed)
    jobs = JobSubmitter(slurm, args, seed + 1000)
    phases = Phases(time.time(), args.phases, args.phase_seconds)
    pods.start()
    jobs.start()
    time.sleep(max(0.0, phases.end - time.time()))
    race_events = [e for e in headroom_events(service, phases.start) if _at(e) < phases.end]
    jobs.stop_submitting()
    jobs.cancel_and_stop()
    probe = whole_node_probe(service, slurm, pods, args)
    slurm.cancel_all()
    delays = delay_probes(service, slurm, args, probes) if probes else None
    service.give_back(taken, slurm)
    return {
        "pods": pod_figures(pods.admissions, phases),
        "jobs": job_figures(jobs, phases),
        "headroom_events_in_race": event_kinds(race_events),
        "whole_node_probe": probe,
        "whole_node_delay": delays,
        "started_at": datetime.fromtimestamp(phases.start, UTC).isoformat(timespec="seconds"),
    }


def comparison(result: dict[str, dict[str, Any]]) -> dict[str, Any]:
    off, on = result["off"]["jobs"], result["on"]["jobs"]
    pods_off, pods_on = result["off"]["pods"], result["on"]["pods"]
    return {
        "jobs_started_on_to_off": ratio(on["started"], off["started"]),
        "jobs_started_on_to_off_per_phase": [
            ratio(b["started"], a["started"])
            for a, b in zip(off["per_phase"], on["per_phase"], strict=True)
        ],
        "job_cpus_started_on_to_off": ratio(on["started_cpus"], off["started_cpus"]),
        "jobs_refused_at_submit_on_to_off": ratio(
            on["refused_at_submit"], off["refused_at_submit"]
        ),
        "pods_admitted_on_to_off": ratio(pods_on["admitted"], pods_off["admitted"]),
    }


# Per part: the counts summed, and the one summed per phase.
TOTALS = {
    "pods": (("admitted", "refused"), "admitted"),
    "jobs": (("submitted", "refused_at_submit", "started", "started_cpus"), "started"),
}


def totals(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each side's counts summed over the rounds (the comparison's input)."""
    return {
        name: {
            part: {
                **{k: sum(r[name][part][k] for r in rounds) for k in keys},
                "per_phase": [
                    {each: sum(p[each] for p in phase)}
                    for phase in zip(*(r[name][part]["per_phase"] for r in rounds), strict=True)
                ],
            }
            for part, (keys, each) in TOTALS.items()
        }
        for name in SIDES
    }


def round_order(order: str, index: int) -> list[str]:
    """The sides' order in round ``index``: ``order``, then swapped every other round, so
    that what running second brings (a warmer cluster, the first side's leftovers) falls on
    each side equally."""
    names = order.split(",")
    return names if index % 2 == 0 else names[::-1]


def pair(text: str, kind: Callable[[str], Any]) -> tuple[Any, Any]:
    low, _, high = text.partition("-")
    return kind(low), kind(high or low)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=3)
    parser.add_argument("--phase-seconds", type=float, default=40.0)
    parser.add_argument("--workers", type=int, default=6, help="pod workers")
    parser.add_argument("--pod-cpus", type=lambda t: pair(t, int), default=(1, 4))
    parser.add_argument("--pod-memory-gi", type=lambda t: pair(t, int), default=(1, 4))
    parser.add_argument("--hold", type=lambda t: pair(t, float), default=(0.2, 1.5))
    parser.add_argument("--refused-pause", type=float, default=0.2, help="seconds")
    parser.add_argument("--queue", type=int, default=3, help="jobs kept pending")
    parser.add_argument(
        "--stuck-seconds", type=float, default=15.0, help="a job pending longer frees its slot"
    )
    parser.add_argument("--job-cpus", type=lambda t: pair(t, int), default=(2, 12))
    parser.add_argument("--job-seconds", type=lambda t: pair(t, int), default=(2, 6))
    parser.add_argument("--job-mem-per-cpu", type=int, default=1000, help="MB (DefMemPerCPU)")
    parser.add_argument("--probe", choices=("exclusive", "cpus"), default="exclusive")
    parser.add_argument("--probe-watch", type=float, default=3.0, help="seconds, pods held")
    parser.add_argument("--probe-wait", type=float, default=60.0, help="seconds, pods gone")
    parser.add_argument("--probe-retry", type=float, default=1.0, help="seconds")
    parser.add_argument(
        "--delay-probes", type=int, default=0, help="whole-node jobs after the race, for p50/p99"
    )
    parser.add_argument("--delay-pod-cpus", type=int, default=8, help="CPUs pods hold then")
    parser.add_argument(
        "--order", default="off,on", choices=("off,on", "on,off"), help="the first round's"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of both sides, the order swapped each"
    )
    parser.add_argument("--seed", type=int, default=31)
    service_arguments(parser, idle_seconds=300.0)  # the service's default
    args = parser.parse_args(argv)
    started = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    slurm = cluster(args.slurm)
    slurm.reset()
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        with headroom_services(slurm, args) as svc:
            for index in range(args.rounds):
                sides: dict[str, dict[str, Any]] = {}
                for name in round_order(args.order, index):
                    # The same pods and jobs on both sides of a round: the same seeds.
                    # The whole-node delay: in the first round only (its p50/p99).
                    probes = args.delay_probes if index == 0 else 0
                    sides[name] = side(name, svc[name], slurm, args, args.seed + index, probes)
                rounds.append(sides)
    finally:
        slurm.reset()
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "slurm": f"{slurm.release} (real slurmctld + slurmrestd, JWT)",
        "database": "sqlite",
        "node": f"{NODE}: {NODE_CPUS} CPUs, {NODE_MEMORY_MIB} MB; every job gets k8scpu/"
        "k8smemory GRES of its CPUs/memory (job_submit/k8s_resource_completion)",
        "settings": {
            "phases": args.phases,
            "phase_seconds": args.phase_seconds,
            "order": args.order,
            "rounds": args.rounds,
            "pod_workers": args.workers,
            "pod_cpus": list(args.pod_cpus),
            "pod_memory_gi": list(args.pod_memory_gi),
            "pod_hold_s": list(args.hold),
            "refused_pause_s": args.refused_pause,
            "jobs_kept_pending": args.queue,
            "stuck_seconds": args.stuck_seconds,
            "job_cpus": list(args.job_cpus),
            "job_sleep_s": list(args.job_seconds),
            "job_mem_per_cpu_mb": args.job_mem_per_cpu,
            "probe": args.probe,
            "probe_watch_s": args.probe_watch,
            "probe_wait_s": args.probe_wait,
            "delay_probes": args.delay_probes,
            "delay_pod_cpus": args.delay_pod_cpus,
            "jobs_queue": args.jobs_queue,
            "headroom": {
                "off": None,
                "on": {
                    "cpu": args.headroom_cpu,
                    "memory": args.headroom_memory,
                    "idle_seconds": args.idle_seconds,
                },
            },
            "seed": args.seed,
        },
        "rounds": [
            {"order": round_order(args.order, i), **r, "on_to_off": comparison(r)}
            for i, r in enumerate(rounds)
        ],
        "total": totals(rounds),
        "on_to_off": comparison(totals(rounds)),
        "load_average": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
