"""Admission confirmed by Slurm (the AdmissionGate the admission service calls).

1. Cap: Kubernetes may hold only its share of the node (app.core.caps), checked by the
   admission decision (app.core.decision) on the ledger's node as the push reads it, before
   anything is sent.
2. Push the lowered counts (the hold is already in the ledger, so the push includes it); the
   push ends with a read of that one node, made after the update landed.
3. From that read: if Slurm's jobs already use more than the remainder (a job started
   between the ledger check and the push), reject; the admission service then undoes the
   hold and calls ``changed``, which raises the counts again.

Why that is enough (no job can take what a confirmed pod holds):
- every job asks for k8scpu/k8smemory/k8sgpu equal to what Slurm allocates it (the
  job_submit/k8s_resource_completion plugin; an ``--exclusive`` job gets every GRES), so
  the node's ``gres_used`` for them is what its jobs use;
- slurmctld starts a job and counts its GRES under the node write lock, and a node update
  takes the same lock: a job either started before the lowered counts landed, and then
  it is in the ``gres_used`` read afterwards, or it started after, and then it had to fit
  in the lowered counts;
- a confirmed hold passed ``used <= size - withheld`` on that read, so jobs never exceed
  what the pods leave. Where the push left a count at 0, Slurm shows no ``gres_used`` for
  it: the push reads what its jobs use from a job listing made after it
  (app.core.counts.slurm_usage). Both survive a slurmctld restart: the counts come back from its
  state (or are pushed again by the sync) and ``gres_used`` is rebuilt from the jobs
  before slurmctld answers (measured on 24.11 and 26.05).
The node's own ``alloc_cpus``/``alloc_memory`` are not a witness: slurmctld refreshes them
only when it lists every node, so a single-node read shows them seconds stale either way
(0 while a job runs, or a cancelled job's CPUs).

Slurm unreachable or refusing the token: reject with that reason (fail closed) unless
``fail_open``, in which case the sync pushes the counts when Slurm is back.

A holding that names GPU devices (docs/gpu-identity.md) is not confirmed by counts alone: a lower
``k8sgpu`` says how many GPUs, never which. First a hold job on exactly those devices
(app.slurm.holds): slurmctld allocates it under its node lock, so of the hold and a job that
want one device at the same instant exactly one gets it, and a device a job has is refused
at once. Then the push, as above: the counts withhold the pod's CPUs, memory and GPU count
too (the hold job asks no k8s GRES), so that a hold that ends while the pod runs
(a scancel, a node set DOWN) exposes none of them; an overlap there ends the hold again. It
fails closed even with ``fail_open``: without the hold nothing keeps a job off the device.

The headroom (app.core.headroom): an admission inside what Slurm was confirmed to withhold
is HELD by the ledger without ``confirm``; the gate only opens that path (``headroom_open``:
not while Slurm is set up so that it would drain the node), and pushes off the caller's
path (``defer_push``: a headroom that ran low, a release on a node with a headroom).
An admission beyond it comes here, and its push withholds the headroom again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from app.core.caps import KubeCaps
from app.core.counts import slurm_overlap
from app.core.decision import decide_admission
from app.core.ledger_errors import AdmissionRejected, NodeNotFound
from app.core.records import Holding, NodeView
from app.core.resources import Resources
from app.core.slurm_models import SlurmJob
from app.slurm.errors import SlurmError, SlurmUnavailable
from app.slurm.holds import HoldJobs, hold_for
from app.slurm.push import Pusher

log = logging.getLogger(__name__)

JobsOn = Callable[[str], Sequence[SlurmJob]]
Refusal = Callable[[], str | None]


def _no_jobs(_: str) -> Sequence[SlurmJob]:
    return ()


def _no_refusal() -> str | None:
    return None


class DeferPush(Protocol):
    """Pushes a node off the caller's path, after ``settle`` seconds at most
    (app.slurm.deferred.DeferredPushes.defer_push)."""

    def __call__(self, node: str, reason: str, *, settle: float = 0.0) -> None: ...


class SlurmGate:
    def __init__(
        self,
        pusher: Pusher,
        caps: KubeCaps,
        *,
        holds: HoldJobs,
        fail_open: bool = False,
        jobs_on: JobsOn = _no_jobs,
        refusal: Refusal = _no_refusal,
        defer_push: DeferPush | None = None,
        contended: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``jobs_on``: the jobs last seen on a Slurm node, only to name them in a refusal.
        ``refusal``: why no admission may be confirmed now (app.slurm.plugins), or None.
        ``holds``: hold jobs for holdings that name GPU devices.
        ``contended``: the ledger nodes where Slurm jobs wait for resources (the sync's)."""
        self.contended = contended
        self.holds = holds
        self.pusher = pusher
        self.caps = caps
        self.fail_open = fail_open
        self.jobs_on = jobs_on
        self.refusal = refusal
        self.deferred = defer_push

    def headroom_open(self, node: str) -> bool:
        """Whether an admission on ``node`` may use its headroom (skip ``confirm`` inside
        it, or set it): not while Slurm's counts may have changed unseen
        (app.slurm.witness), nor while Slurm jobs wait for resources there: the sync gives
        that node's headroom back each step, and an admission would only set it again."""
        witness = self.pusher.witness
        return (
            self.refusal() is None
            and (witness is None or witness.trusted())
            and node not in self.contended()
        )

    def confirm(self, holding: Holding) -> str | None:
        """AdmissionGate.confirm: the hold job's id for a device holding, else None."""
        # Slurm set up so that it would drain the node: fail closed, even with fail_open.
        if (refused := self.refusal()) is not None:
            raise AdmissionRejected(f"Slurm cannot share nodes safely: {refused}")
        if holding.devices:
            return self._hold_devices(holding)
        try:
            self._push_checked(holding)
        except SlurmError as exc:
            if self.fail_open:
                # slurmrestd away: its client logs the outage once (app.outages).
                away = isinstance(exc, SlurmUnavailable)
                level = logging.DEBUG if away else logging.WARNING
                what = "admitting on %s without Slurm's confirmation: %s"
                log.log(level, what, holding.node, exc)
                return None
            raise AdmissionRejected(f"Slurm cannot confirm the admission: {exc.message}") from exc
        return None

    def _push_checked(self, holding: Holding, hold: str | None = None) -> None:
        """Push the node's counts (the holding included) and reject if Slurm's jobs already
        use what they withhold; SlurmError when Slurm cannot answer. ``hold``: the holding's
        hold job, just made: the ledger records it only once this returns, and until then
        it is any Slurm job to every other reader, but not to this check."""
        reason = f"admitting {holding.holder.display_name}"
        # The cap is checked on the ledger's node as the push reads it (the hold included),
        # before any count is sent.
        result = self.pusher.push(holding.node, reason=reason, check=self._within_cap, hold=hold)
        if problems := slurm_overlap(result.node, result.used, result.held):
            raise AdmissionRejected(
                f"Slurm already holds it on node {result.node.name}: {'; '.join(problems)}"
                f"{_jobs(self.jobs_on(result.node.name))}"
            )

    def _hold_devices(self, holding: Holding) -> str:
        """The hold job's id, once Slurm holds the holding's devices and its counts withhold
        the pod's CPUs, memory and GPU count (module docstring); the hold first, since a
        device a job has is the usual refusal and costs no push then."""
        view = self.pusher.ledger.get_node(holding.node)
        self._within_cap(view)
        what = f"GPU devices {list(holding.device_indices)} on node {view.slurm_name}"
        try:
            job = hold_for(self.holds, view.slurm_name, holding)
        except SlurmError as exc:
            raise AdmissionRejected(f"Slurm cannot hold {what}: {exc.message}") from exc
        try:
            self._push_checked(holding, job)
        except (SlurmError, AdmissionRejected) as exc:
            # Fails closed even with fail_open; the hold goes with the admission (if this
            # cancel fails, the sync's sweep ends the hold no holding names).
            try:
                self.holds.cancel(job, slurm_node=view.slurm_name)
            except SlurmError:
                log.warning("ending hold job %s of a rejected admission failed", job)
            if isinstance(exc, AdmissionRejected):
                raise
            raise AdmissionRejected(
                f"Slurm cannot confirm the counts for {what}: {exc.message}"
            ) from exc
        return job

    def released(self, holding: Holding) -> None:
        """``holding`` left the ledger: end its hold job, if it has one (the sync ends one
        this misses, app.slurm.sync)."""
        if holding.slurm_hold is None:
            return
        try:
            slurm_name: str | None = self.pusher.ledger.get_node(holding.node).slurm_name
        except NodeNotFound:
            slurm_name = None  # the hold's node is read from Slurm instead
        self.holds.cancel(holding.slurm_hold, slurm_node=slurm_name)
        if slurm_name is not None:
            # The hold's end made Slurm withhold every GPU of the node (the prep/k8s_gpu_fence
            # plugin) until the ledger's counts are pushed again: the pod is gone, so now.
            self.pusher.push(holding.node, reason="hold job ended")

    def _within_cap(self, node: NodeView) -> None:
        # The admission decision on the hold, which is among the node's holdings: its cap.
        decision = decide_admission(node, Resources.ZERO, caps=self.caps, held=True)
        if decision.refused:
            raise decision.error

    def changed(self, node: str) -> None:
        self.pusher.push(node, reason="holdings changed")

    def defer_push(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        if self.deferred is None:
            self.pusher.push(node, reason=reason)
        else:
            self.deferred(node, reason, settle=settle)


def _jobs(jobs: Sequence[SlurmJob]) -> str:
    names = [f"{job.job_id} ({job.name})" for job in jobs if job.holds_resources]
    return f" (jobs {', '.join(names)})" if names else ""
