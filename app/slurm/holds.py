"""Hold jobs: a GPU pod's exact devices held in Slurm, so that a pod and a job never share
one (docs/gpu-identity.md).

Why a job: with one GRES type per device (``gpu:gN`` is ``/dev/nvidiaN``) a job can ask for
exactly the pod's devices, and slurmctld allocates under its node lock, so of a hold and a
job that want the same device at the same instant exactly one gets it. ``immediate`` makes
the answer synchronous (a few ms): a device that is taken is refused at once ("Requested
nodes are busy"), never waited for. Top priority, because ``immediate`` is refused while
any job of higher priority pends ("insufficient priority").

A hold is marked (name ``nodeledger-hold``, the holder in its comment) so that the sweep
can tell the service's holds from its user's other jobs; the ledger records its id with the
holding, and only then is it the pod's, not a Slurm job's (app.core.slurm_models.LedgerHolds:
a name and a comment any user can give a job).
API v0.0.43 and later (Slurm >= 25.05) get the EXTERNAL_JOB flag: nothing is started on the
node and a cancel frees the devices without an epilog round trip. Before that (24.11,
v0.0.42) the hold is a plain allocation without a step: slurmrestd allocates it without a
response port, so slurmctld neither pings it nor ends it for inactivity; measured to stay
RUNNING and to hold its devices.

Not retried: an allocation whose answer was lost may still be a job. Such a hold is one no
holding names; whoever compares ``running()`` with the ledger cancels it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.ledger_errors import AdmissionRejected
from app.core.records import Holding
from app.core.slurm_models import (
    HOLD_JOB_NAME,
    RELEASED_COMMENT,
    LedgerHolds,
    SlurmJob,
    hold_comment,
)
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmError, SlurmRequestError

# Slurm's answers that mean "not these devices, not now" (slurm_errno.h).
NOT_TOP_PRIORITY = 2013  # a job of higher priority pends
NODE_CONFIG_UNAVAILABLE = 2014  # the node has no such device type, or too few CPUs/memory
NODES_BUSY = 2016  # a job holds the device (or the CPUs/memory) now
REFUSALS = frozenset({NOT_TOP_PRIORITY, NODE_CONFIG_UNAVAILABLE, NODES_BUSY})

# What a hold job asks beside its devices: a job has at least one CPU (Slurm gives a whole
# core) and some memory (0 would mean all of the node's). The job_submit plugin adds no k8s
# GRES to it (job_submit_k8s_resource_completion.c, name nodeledger-hold from SlurmUser).
HOLD_CPUS = 1
HOLD_MEMORY_MB = 1
TOP_PRIORITY = 4294967293  # the highest a job can be given (NO_VAL - 2); SlurmUser may set it
UNLIMITED: dict[str, Any] = {"set": True, "infinite": True, "number": 0}
_EXTERNAL_FROM = 43  # API v0.0.43 (Slurm 25.05) knows the EXTERNAL_JOB flag


def device_type(index: int) -> str:
    """The GRES type of GPU device ``index`` in gres.conf (``Type=gN File=/dev/nvidiaN``)."""
    return f"g{index}"


def hold_tres(devices: Sequence[int]) -> str:
    """``tres_per_node`` that names exactly ``devices``: ``gres/gpu:g1:1,gres/gpu:g2:1``."""
    return ",".join(f"gres/gpu:{device_type(d)}:1" for d in sorted(set(devices)))


@dataclass(frozen=True, slots=True)
class HoldJob:
    """A hold job Slurm has: which holder it holds for, where, and which devices (empty
    while it is COMPLETING: slurmrestd then omits its GRES)."""

    job_id: str
    holder_id: str
    slurm_node: str
    devices: tuple[int, ...]

    @classmethod
    def of(cls, job: SlurmJob, user: str) -> HoldJob | None:
        """The hold ``job`` is, submitted by the service's Slurm ``user``; None for any other
        job (another user's, whatever its name), or one that holds nothing now."""
        holder = LedgerHolds(user).holder_of(job)
        if holder is None or not job.holds_resources or not job.allocations:
            return None
        allocation = job.allocations[0]  # a hold is on one node
        return cls(job.job_id, holder, allocation.node, allocation.devices)


def holds_in(jobs: Iterable[SlurmJob], user: str) -> dict[str, HoldJob]:
    """The hold jobs ``user`` (the service's) has among ``jobs`` (a listing the sync already
    has), by job id."""
    return {h.job_id: h for j in jobs if (h := HoldJob.of(j, user)) is not None}


def hold_for(holds: HoldJobs, slurm_node: str, holding: Holding) -> str:
    """``holds.hold`` for a ledger holding: exactly its devices, with the least CPUs and
    memory a job can have (HOLD_CPUS, HOLD_MEMORY_MB). The pod's own CPUs, memory and GPU
    count are withheld by the pushed counts (app.core.headroom.held), not by its hold job,
    so that a hold that ends exposes none of them."""
    return holds.hold(
        slurm_node,
        holding.holder.id,
        devices=holding.device_indices,
        cpus=HOLD_CPUS,
        memory_mb=HOLD_MEMORY_MB,
    )


class HoldJobs:
    """Hold, release and list hold jobs through slurmrestd (as SlurmUser: top priority)."""

    def __init__(self, client: SlurmClient) -> None:
        self.client = client

    @property
    def user(self) -> str:
        """The Slurm user the hold jobs are submitted as (slurmrestd's X-SLURM-USER-NAME)."""
        return self.client.user_name

    def hold(
        self, slurm_node: str, holder_id: str, *, devices: Sequence[int], cpus: int, memory_mb: int
    ) -> str:
        """Hold ``devices`` of ``slurm_node`` for ``holder_id``, with ``cpus`` and
        ``memory_mb`` (each at least 1: a job has both), now or not at all; the job id.

        Raises AdmissionRejected when Slurm refuses (a device or the CPUs/memory taken, a
        device type the node does not have, a job of higher priority pending), SlurmError
        when it cannot answer or refuses for another reason (no such node, ...)."""
        if not devices:
            raise ValueError("a hold job names at least one device")
        wanted = ", ".join(f"gpu{d}" for d in sorted(set(devices)))
        try:
            job_id = self.client.allocate_job(
                self._job(slurm_node, holder_id, devices, max(1, cpus), max(1, memory_mb))
            )
        except SlurmRequestError as exc:
            if not any(e.error_number in REFUSALS for e in exc.errors):
                raise
            why = "; ".join(e.error for e in exc.errors if e.error_number in REFUSALS)
            raise AdmissionRejected(
                f"Slurm node {slurm_node} cannot hold GPU devices {wanted} now: {why}"
            ) from exc
        self._unlimited(job_id, slurm_node)
        return job_id

    def _unlimited(self, job_id: str, slurm_node: str) -> None:
        """Lift the hold's time limit past its partition's (and QOS's) MaxTime: an operator's
        limit (SlurmUser's) is not checked against them. Asked at allocation instead, an
        unlimited time under a finite MaxTime leaves the job PENDING (PartitionTimeLimit)
        while ``immediate`` answers with its id (measured on 24.11). On failure the hold is
        ended: a hold that would end at the partition's limit is not given out."""
        try:
            self.client.update_job(job_id, {"time_limit": UNLIMITED})
        except SlurmError:
            self.cancel(job_id, slurm_node=slurm_node)
            raise

    def cancel(self, job_id: str, *, slurm_node: str | None = None) -> None:
        """End a hold job whose holding is gone (marked released first, so that its end
        withholds none of the node's GPUs), then wake the scheduler for what it frees (a
        no-op update of its node; without it jobs waiting for the devices wait for the next
        scheduling pass).
        Idempotent: a job that ended or that Slurm has forgotten is fine. ``slurm_node``:
        the hold's node, when the caller knows it (else read from Slurm first)."""
        if slurm_node is None:
            job = self.client.get_job(job_id)
            if job is None:
                return
            slurm_node = job.allocations[0].node if job.allocations else None
        # Its holding is gone: the fence plugin need not withhold the node's GPUs. Ended
        # meanwhile, or refused: the cancel then fences the node (fails closed).
        with contextlib.suppress(SlurmRequestError):
            self.client.update_job(job_id, {"comment": RELEASED_COMMENT})
        self.client.cancel_job(job_id)
        if slurm_node is not None:
            self.client.update_node(slurm_node)

    def running(self) -> dict[str, HoldJob]:
        """The hold jobs Slurm has, holding now, by job id (one full listing of jobs)."""
        listing = self.client.get_jobs()
        return holds_in(listing.items if listing is not None else (), self.user)

    def _job(
        self, node: str, holder_id: str, devices: Sequence[int], cpus: int, memory_mb: int
    ) -> dict[str, Any]:
        job: dict[str, Any] = {
            "name": HOLD_JOB_NAME,
            "comment": hold_comment(holder_id),
            "required_nodes": [node],
            "tres_per_node": hold_tres(devices),
            "minimum_cpus": cpus,
            "memory_per_node": {"set": True, "number": memory_mb},
            # No time_limit: the partition's default, so that it starts now (_unlimited).
            "priority": {"set": True, "number": TOP_PRIORITY},
            "immediate": True,
            "current_working_directory": "/",  # a job without a script still needs one
        }
        if int(self.client.version.rsplit(".", 1)[1]) >= _EXTERNAL_FROM:
            job["flags"] = ["EXTERNAL_JOB"]
        return job
