"""The racing load: pod admissions and releases spread over every replica, and Slurm jobs
submitted beside them onto the same nodes. The clients keep a book of what the answers
told them; the final checks compare the ledger with it."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.api import Answer, Api, Findings
from bench.chaos.slurm import ChaosSlurm

MIB = 1024**2
GIB = 1024**3
CPU_MILLIS = {"500m": 500, "1": 1000, "1500m": 1500, "2": 2000, "3": 3000, "4": 4000}
MEMORY_GI = (1, 2, 3, 4)


@dataclass(frozen=True, slots=True)
class Pod:
    uid: str
    node: str
    cpu: str
    memory: str
    cpu_millis: int
    memory_bytes: int

    @classmethod
    def random(cls, rng: random.Random, nodes: tuple[str, ...]) -> Pod:
        cpu = rng.choice(sorted(CPU_MILLIS))
        gi = rng.choice(MEMORY_GI)
        uid = str(uuid.UUID(int=rng.getrandbits(128)))
        return cls(uid, rng.choice(nodes), cpu, f"{gi}Gi", CPU_MILLIS[cpu], gi * GIB)

    def admission(self) -> dict[str, Any]:
        holder = {"kind": "pod", "namespace": "chaos", "name": f"p-{self.uid[:8]}", "uid": self.uid}
        return {
            "node": self.node,
            "holder": holder,
            "requests": {"cpu": self.cpu, "memory": self.memory},
        }


def rejection_class(detail: str) -> str:
    if "Slurm already holds it" in detail:
        return "slurm_overlap"  # a job started before the lowered counts landed
    if "Slurm cannot confirm" in detail:
        return "slurm_unavailable"
    if "insufficient resources" in detail or "not admissible" in detail:
        return "ledger_full"
    return "other"


@dataclass
class Book:
    """What the clients believe from the answers they got. Thread-safe."""

    admitted: dict[str, Pod] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    unknown: dict[str, Pod] = field(default_factory=dict)  # never got a final answer
    live: list[Pod] = field(default_factory=list)  # admitted, not released: may be released
    counts: Counter[str] = field(default_factory=Counter)
    rejections: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def take_live(self, rng: random.Random) -> Pod | None:
        with self._lock:
            if not self.live:
                return None
            return self.live.pop(rng.randrange(len(self.live)))

    def live_count(self) -> int:
        with self._lock:
            return len(self.live)

    def admitted_now(self, pod: Pod) -> None:
        with self._lock:
            self.admitted[pod.uid] = pod
            self.live.append(pod)

    def released_now(self, pod: Pod) -> None:
        with self._lock:
            self.released.add(pod.uid)

    def unknown_now(self, pod: Pod) -> None:
        with self._lock:
            self.unknown[pod.uid] = pod

    def rejected_now(self, detail: str) -> None:
        with self._lock:
            self.rejections[rejection_class(detail)] += 1


class PodClient:
    """Admits and releases pods through any replica, retrying like a scheduler would."""

    def __init__(
        self, api: Api, book: Book, findings: Findings, rng: random.Random, nodes: tuple[str, ...]
    ) -> None:
        self.api = api
        self.book = book
        self.findings = findings
        self.rng = rng
        self.nodes = nodes

    def admit(self, prefer: int | None = None) -> Answer | None:
        pod = Pod.random(self.rng, self.nodes)
        self.book.count("admissions_attempted")
        answer = self.api.send("POST", "/v1/admissions", pod.admission(), prefer=prefer)
        self._admission_outcome(pod, answer)
        return answer

    def _admission_outcome(self, pod: Pod, answer: Answer | None) -> None:
        if answer is None:
            self.book.count("admissions_unanswered")
            self.book.unknown_now(pod)
            return
        if answer.lost:
            self.book.count("admissions_answer_lost_then_retried")
        if answer.status in (200, 201):
            if answer.status == 200 and not answer.lost:
                self.findings.add("admission_200_for_new_uid", uid=pod.uid, body=answer.body)
            state = answer.body.get("state") if isinstance(answer.body, dict) else None
            if state != "held":
                self.findings.add("admitted_not_held", uid=pod.uid, body=answer.body)
            self.book.count("admitted")
            self.book.admitted_now(pod)
        elif answer.status == 409:
            self.book.count("rejected")
            self.book.rejected_now(str(_detail(answer.body)))
        else:
            self.book.count(f"admission_http_{answer.status}")
            self.findings.add(
                "admission_unexpected_status", uid=pod.uid, status=answer.status, body=answer.body
            )

    def release(self, prefer: int | None = None) -> Answer | None:
        pod = self.book.take_live(self.rng)
        if pod is None:
            return None
        self.book.count("releases_attempted")
        answer = self.api.send("DELETE", f"/v1/admissions/{pod.uid}", prefer=prefer)
        if answer is None:
            self.book.count("releases_unanswered")
            self.book.unknown_now(pod)
        elif answer.status == 200 or (answer.status == 404 and answer.lost):
            # 404 after a lost answer: the killed replica released it before dying.
            self.book.count("released")
            self.book.released_now(pod)
        else:
            self.book.count(f"release_http_{answer.status}")
            self.findings.add(
                "release_of_admitted_pod_failed",
                uid=pod.uid,
                status=answer.status,
                body=answer.body,
            )
        return answer

    def run(self, stop: threading.Event, max_live: int, release_share: float) -> None:
        """Admit and release until ``stop``; about ``max_live`` pods alive at most."""
        while not stop.is_set():
            live = self.book.live_count()
            if live and (live >= max_live or self.rng.random() < release_share):
                self.release()
            else:
                self.admit()
            stop.wait(self.rng.uniform(0, 0.1))


def _detail(body: Any) -> Any:
    return body.get("detail", body) if isinstance(body, dict) else body


@dataclass
class JobStats:
    submitted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    job_ids: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)


class JobSubmitter:
    """sbatch of short jobs (1-3 s, 1-4 CPUs), pinned to a node or not, with the k8s GRES
    given explicitly or left to the job_submit plugin."""

    def __init__(
        self, slurm: ChaosSlurm, stats: JobStats, rng: random.Random, nodes: tuple[str, ...]
    ) -> None:
        self.slurm = slurm
        self.stats = stats
        self.rng = rng
        self.nodes = nodes

    def arguments(self) -> list[str]:
        cpus = self.rng.choice((1, 2, 3, 4))
        mem = cpus * self.rng.choice((500, 1000, 2000))
        args = ["-c", str(cpus), f"--mem={mem}", "--wrap", f"sleep {self.rng.choice((1, 2, 3))}"]
        if self.rng.random() < 0.5:
            args = [f"--gres=k8scpu:{cpus},k8smemory:{mem}", *args]
        if self.rng.random() < 0.7:
            args = ["-w", self.rng.choice(self.nodes), *args]
        return args

    def submit(self) -> None:
        args = self.arguments()
        try:
            job_id = self.slurm.sbatch(*args)
        except RuntimeError as exc:
            reason = str(exc).strip().splitlines()[-1][:120]
            with self.stats._lock:
                self.stats.refused[reason] += 1
            return
        with self.stats._lock:
            self.stats.submitted += 1
            self.stats.job_ids.add(job_id)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.rng.uniform(0.05, 0.4)):
            self.submit()
