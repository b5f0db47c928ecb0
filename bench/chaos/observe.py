"""Watchers that run beside the load.

InvariantSampler: per node, what Slurm jobs use (squeue) plus what pods hold (the ledger)
never exceeds the node, and Slurm's k8s totals always leave room for the pods. The ledger
is read before and after Slurm and only pods held in both reads count, so every pod
counted held at the moment Slurm was read: a violation is real, never an artefact of the
reads not being simultaneous (uids are never admitted twice).

LeaderWatch: which replica runs the Slurm sync (from /readyz), how often that changes,
and how long after the leader is killed another one takes over.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.chaos.api import Api, Findings
from bench.chaos.replicas import Replica, readyz, slurm_role
from bench.chaos.slurm import ChaosSlurm, NodeCounts, RunningJob

MIB = 1024**2

HeldPods = dict[str, tuple[str, int, int]]  # uid -> (node, millicores, bytes)


def held_pods(api: Api) -> HeldPods | None:
    rows = api.get("/v1/holdings", {"holder_kind": "pod"})
    if rows is None:
        return None
    return {
        r["holder"]["id"]: (r["node"], r["requests"]["cpu_millis"], r["requests"]["memory_bytes"])
        for r in rows
        if r["state"] == "held"
    }


def held_throughout(before: HeldPods, after: HeldPods) -> HeldPods:
    return {uid: pod for uid, pod in before.items() if after.get(uid) == pod}


@dataclass(frozen=True, slots=True)
class NodeUse:
    """One node at one sample, in Slurm's units (whole CPUs, MB)."""

    node: str
    jobs_cpus: int
    jobs_mb: int
    pods_cpus: int  # ceil(held millicores / 1000)
    pods_mb: int  # ceil(held bytes / MiB)
    k8scpu: int
    k8smemory: int
    size: NodeCounts

    def violations(self) -> list[str]:
        found = []
        if self.jobs_cpus + self.pods_cpus > self.size.cpus:
            found.append("cpu: jobs + pods above the node")
        if self.jobs_mb + self.pods_mb > self.size.memory_mb:
            found.append("memory: jobs + pods above the node")
        if self.k8scpu + self.pods_cpus > self.size.cpus:
            found.append("k8scpu: Slurm's total overlaps the pods")
        if self.k8smemory + self.pods_mb > self.size.memory_mb:
            found.append("k8smemory: Slurm's total overlaps the pods")
        return found

    def figures(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "slurm_jobs": {"cpus": self.jobs_cpus, "mb": self.jobs_mb},
            "pods_held": {"cpus": self.pods_cpus, "mb": self.pods_mb},
            "slurm_totals": {"k8scpu": self.k8scpu, "k8smemory": self.k8smemory},
            "node_size": {"cpus": self.size.cpus, "mb": self.size.memory_mb},
        }


def node_use(
    node: str, size: NodeCounts, counts: NodeCounts, jobs: list[RunningJob], pods: HeldPods
) -> NodeUse:
    millis = sum(p[1] for p in pods.values() if p[0] == node)
    nbytes = sum(p[2] for p in pods.values() if p[0] == node)
    here = [j for j in jobs if j.node == node]
    return NodeUse(
        node,
        sum(j.cpus for j in here),
        sum(j.memory_mb for j in here),
        -(-millis // 1000),
        -(-nbytes // MIB),
        counts.k8scpu,
        counts.k8smemory,
        size,
    )


@dataclass
class SamplerStats:
    samples: int = 0
    skipped: int = 0  # no replica answered, or Slurm did not
    violations: int = 0
    first_violations: list[dict[str, Any]] = field(default_factory=list)
    jobs_seen: set[str] = field(default_factory=set)
    max_jobs_cpus: dict[str, int] = field(default_factory=dict)
    max_pods_cpus: dict[str, int] = field(default_factory=dict)
    max_sum_cpus: dict[str, int] = field(default_factory=dict)  # jobs + pods, the tightest


class InvariantSampler:
    def __init__(
        self,
        api: Api,
        slurm: ChaosSlurm,
        sizes: dict[str, NodeCounts],
        findings: Findings,
        interval: float,
    ) -> None:
        self.api = api
        self.slurm = slurm
        self.sizes = sizes
        self.findings = findings
        self.interval = interval
        self.stats = SamplerStats()

    def sample(self) -> None:
        before = held_pods(self.api)
        try:
            jobs, counts = self.slurm.snapshot()
        except RuntimeError:
            self.stats.skipped += 1
            return
        after = held_pods(self.api)
        if before is None or after is None:
            self.stats.skipped += 1
            return
        pods = held_throughout(before, after)
        self.stats.samples += 1
        self.stats.jobs_seen.update(j.job_id for j in jobs)
        for node, size in self.sizes.items():
            self._check(node_use(node, size, counts[node], jobs, pods), jobs)

    def _check(self, use: NodeUse, jobs: list[RunningJob]) -> None:
        s = self.stats
        s.max_jobs_cpus[use.node] = max(s.max_jobs_cpus.get(use.node, 0), use.jobs_cpus)
        s.max_pods_cpus[use.node] = max(s.max_pods_cpus.get(use.node, 0), use.pods_cpus)
        total = use.jobs_cpus + use.pods_cpus
        s.max_sum_cpus[use.node] = max(s.max_sum_cpus.get(use.node, 0), total)
        problems = use.violations()
        if not problems:
            return
        s.violations += 1
        if len(s.first_violations) < 5:
            s.first_violations.append(
                {
                    "at_s": round(self.findings.elapsed(), 3),
                    "problems": problems,
                    **use.figures(),
                    "jobs": [j.job_id for j in jobs if j.node == use.node],
                }
            )

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.sample()
            stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


@dataclass
class LeaderStats:
    polls: int = 0
    changes: int = 0
    polls_without_leader: int = 0
    polls_with_two_leaders: int = 0
    roles_seen: Counter[str] = field(default_factory=Counter)  # per replica and poll
    takeover_s: list[float] = field(default_factory=list)


class LeaderWatch:
    def __init__(self, replicas: list[Replica], findings: Findings, interval: float) -> None:
        self.replicas = replicas
        self.findings = findings
        self.interval = interval
        self.stats = LeaderStats()
        self._client = httpx.Client()
        self._lock = threading.Lock()
        self._leader: tuple[int, int] | None = None  # (replica index, generation)
        self._killed: tuple[tuple[int, int], float] | None = None

    def leader_killed(self, replica: Replica, at: float) -> None:
        """The kill thread killed ``replica`` believing it the leader."""
        with self._lock:
            self._killed = ((replica.index, replica.generation), at)

    def is_leader(self, replica: Replica) -> bool:
        """Whether the last poll saw ``replica`` (this very process) run the Slurm sync."""
        with self._lock:
            return self._leader == (replica.index, replica.generation)

    def _leaders(self, replicas: list[Replica]) -> list[tuple[int, int]]:
        generations = [(r.index, r.generation) for r in replicas]
        roles = [slurm_role(readyz(self._client, r.url)) for r in replicas]
        self.stats.roles_seen.update(roles)
        return [g for g, role in zip(generations, roles, strict=True) if role == "leader"]

    def poll(self) -> None:
        leaders = self._leaders(self.replicas)
        now = time.monotonic()
        if len(leaders) > 1:
            # The replicas are asked one after the other: the first may have been killed
            # and replaced since. Only a claim both make again, unkilled, counts.
            claimants = [r for r in self.replicas if (r.index, r.generation) in leaders]
            leaders = [g for g in self._leaders(claimants) if g in leaders]
        s = self.stats
        s.polls += 1
        if not leaders:
            s.polls_without_leader += 1
            return
        if len(leaders) > 1:
            s.polls_with_two_leaders += 1
            self.findings.add("two_replicas_claim_the_slurm_sync", replicas=leaders)
        with self._lock:
            if leaders[0] != self._leader:
                s.changes += 1 if self._leader is not None else 0
                self._leader = leaders[0]
            if self._killed is not None and leaders[0] != self._killed[0]:
                s.takeover_s.append(now - self._killed[1])
                self._killed = None

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.poll()
        self._client.close()
