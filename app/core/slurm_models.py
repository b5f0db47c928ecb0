"""What the service needs to know of Slurm, independent of the slurmrestd API version.

Hold jobs: a GPU pod's devices are held in Slurm by a job of the service's own,
named ``HOLD_JOB_NAME`` with comment ``HOLD_COMMENT_PREFIX + holder id`` (app.slurm.holds).
Such a job is the pod, already a holding of the ledger's: it is not counted a second time
as a Slurm job's. Which jobs those are is ``LedgerHolds``'s one answer: a name and a comment
anyone can give a job, so they never make one a hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from app.core.records import Holding

T = TypeVar("T")

HOLD_JOB_NAME = "nodeledger-hold"
HOLD_COMMENT_PREFIX = "nodeledger-hold:"
# The comment the service gives a hold job it is about to cancel, its holding gone: the
# prep/k8s_gpu_fence plugin then frees the device without withholding the node's GPUs
# (it fences only holds that end while their pod may still use the device).
RELEASED_COMMENT = "nodeledger-released:"
# A k8s GRES in a job's TRES request: "gres/k8scpu:2" (24.11 on), "gres:k8scpu:2" (older).
_K8S_GRES = re.compile(r"gres[/:]k8s(?:cpu|memory|gpu)\b")
# Reason=Priority is a job queued behind one waiting for resources: that one names the
# partition already.
# "Constraints": queued by extra constraints (docs/slurm.md#jobs-wait-for-what-pods-hold).
_WAITING_FOR_RESOURCES = frozenset({"Resources", "BadConstraints", "Constraints"})
# The jobs queue's extra constraint (job_submit plugin), alone or in a user's expression.
_QUEUE_CONSTRAINT = re.compile(r"(?<![\w.])nodeledger=1(?![\w.])")


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    cpus: int
    real_memory_mb: int
    specialized_memory_mb: int
    alloc_cpus: int
    alloc_memory_mb: int
    gres: str
    gres_used: str
    states: frozenset[str]
    reason: str
    extra: str
    partitions: frozenset[str] = frozenset()
    comment: str = ""

    @property
    def usable_memory_mb(self) -> int:
        """RealMemory minus MemSpecLimit: what jobs can be given."""
        return max(0, self.real_memory_mb - self.specialized_memory_mb)


@dataclass(frozen=True, slots=True)
class JobAllocation:
    """What one job holds on one node."""

    node: str
    cpus: int
    memory_mb: int
    gpus: int
    devices: tuple[int, ...] = ()  # GPU device indices (gres_detail IDX), when Slurm names them


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: str
    name: str
    user: str
    states: frozenset[str]
    allocations: tuple[JobAllocation, ...]
    comment: str = ""
    state_reason: str = ""  # why a PENDING job waits: "Resources", "BadConstraints", ...
    tres_per_node: str = ""  # what it asks per node: "gres/k8scpu:2,gres/k8smemory:200"
    partitions: frozenset[str] = frozenset()  # where it may run (one, or several asked)
    extra: str = ""  # its extra constraints: "nodeledger=1" when it queues behind pods

    @property
    def holds_resources(self) -> bool:
        # COMPLETING keeps its allocation until every node has cleaned up.
        return bool(self.states & {"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING"})

    @property
    def held_back(self) -> bool:
        """Pending, and marked non-runnable by slurmctld (Reason=BadConstraints) while it
        asks for k8s GRES: the node totals the ledger lowered may be why
        (app.slurm.held_back)."""
        return (
            "PENDING" in self.states
            and self.state_reason == "BadConstraints"
            and _K8S_GRES.search(self.tres_per_node) is not None
        )

    @property
    def needs_queue_marker(self) -> bool:
        """Pending with an extra constraint that names the jobs queue's marker: it can start
        only on a node whose Extra carries it (docs/slurm.md#jobs-wait-for-what-pods-hold),
        whatever the service's setting is now."""
        return "PENDING" in self.states and _QUEUE_CONSTRAINT.search(self.extra) is not None

    @property
    def waits_for_resources(self) -> bool:
        """Pending for resources (Reason=Resources, or held back as above), or refused at
        submit, while asking for k8s GRES: a node's headroom in its partitions withholds
        what it could use (app.core.headroom.settled_target). A job slurmctld refused at
        submit ("Requested node configuration is not available": more k8s GRES than any
        node's current total) stays listed as FAILED, Reason=BadConstraints, for
        MinJobAge (24.11.5 and 26.05.3): the only trace of a user Slurm turned away. A job
        waiting for its begin time, a dependency or a hold waits for no node. A hold job of
        the service's asks no k8s GRES (the job_submit plugin gives it none)."""
        pending = "PENDING" in self.states and self.state_reason in _WAITING_FOR_RESOURCES
        asks_k8s = _K8S_GRES.search(self.tres_per_node) is not None
        return (pending or self.refused_at_submit) and asks_k8s

    @property
    def refused_at_submit(self) -> bool:
        """slurmctld's record of a job it refused at submit (FAILED, BadConstraints)."""
        return "FAILED" in self.states and self.state_reason == "BadConstraints"


@dataclass(frozen=True, slots=True)
class LedgerHolds:
    """Which Slurm jobs are the ledger's hold jobs: the one rule every reader of Slurm's
    jobs applies (the plan, the counts, the gate's check of a count at 0, the device
    taints, the sweep). A hold job is one whose id the ledger recorded for a holding
    (``Holding.slurm_hold``) and that the service's Slurm user submitted (the slurmrestd
    user: SlurmUser or root, the only users whose ``nodeledger-hold`` jobs the job_submit
    plugin gives no k8s GRES). Every other job is Slurm's, whatever its name or comment.

    A hold the service has allocated but not recorded yet (mid-admission) is Slurm's too:
    it does hold a core, a MB and a device until then, so counting it is never an
    undercount; the admission that made it names it to its own push (app.slurm.gate)."""

    user: str  # the service's Slurm user (its hold jobs' user_name)
    recorded: frozenset[str] = frozenset()  # the hold job ids the ledger recorded

    @classmethod
    def of(cls, user: str, holdings: Iterable[Holding]) -> LedgerHolds:
        """The holds ``holdings`` recorded, submitted by ``user``."""
        return cls(user, frozenset(h.slurm_hold for h in holdings if h.slurm_hold is not None))

    def also(self, job_id: str | None) -> LedgerHolds:
        """These, and ``job_id`` (a hold made and not recorded yet); unchanged for None."""
        return self if job_id is None else replace(self, recorded=self.recorded | {job_id})

    def owns(self, job: SlurmJob) -> bool:
        """Whether ``job`` is a hold job of the ledger's (a pod's already: not Slurm's)."""
        return job.job_id in self.recorded and job.user == self.user

    def holder_of(self, job: SlurmJob) -> str | None:
        """The holder a hold job the service submitted holds for (its comment), recorded or
        not: what the sweep compares with the ledger to end the ones no holding names. None
        for any other job: another user's job is never taken for one of the service's."""
        if job.user != self.user or job.name != HOLD_JOB_NAME:
            return None
        if job.comment.startswith(RELEASED_COMMENT):
            return ""  # being cancelled; no holding is named "": ended if its cancel failed
        if not job.comment.startswith(HOLD_COMMENT_PREFIX):
            return None
        return job.comment.removeprefix(HOLD_COMMENT_PREFIX)


def hold_comment(holder_id: str) -> str:
    """The comment that marks a hold job and names its holder."""
    return HOLD_COMMENT_PREFIX + holder_id


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    """Items and the cluster time they are current at (for the next ?update_time=)."""

    items: tuple[T, ...]
    last_update: int
