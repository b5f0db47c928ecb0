"""Admission = hold in the ledger, then let an external gate (Slurm) confirm the hold.

1. Hold: the ledger's atomic check-and-hold, as PENDING when a gate must confirm; HELD at
   once when it fits what the gate's system already withholds (the headroom,
   app.core.headroom), and then the gate is asked to refill that, later, if it ran low.
2. Confirm: the gate tells the external system and checks it agrees (e.g. pushes the
   lowered k8scpu counts and reads the node back).
3. On refusal, undo the hold and tell the gate to restore what it pushed; on success,
   mark the holding HELD.
A release removes the holding, ends its hold job if it has one (GPU devices),
then tells the gate (off the caller's path with a headroom configured) unless what it
freed stayed withheld as its node's headroom; recording a pod
that another scheduler already bound tells the gate too (the ledger takes the truth,
Slurm must follow).

Each admission and release is written once, as a flow over its request (``Flow``) that
yields the steps waiting on the gate's system; ``admit``/``release`` run it in the
caller's thread, ``admit_async``/``release_async`` from the event loop, where
``_from_event_loop`` alone decides which part goes to a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

from anyio import to_thread

from app.core.ledger_errors import AdmissionRejected, HoldingNotFound
from app.core.records import (
    HeldDevice,
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    Recorded,
    Recording,
    Release,
)
from app.core.resources import Resources
from app.ledger import events
from app.ledger.service import Admission, Ledger
from app.logs import log_context
from app.metrics.registry import NO_METRICS, AdmissionPath, AdmissionTimer, Metrics, ReleasePath

log = logging.getLogger(__name__)

# The holder id of a pod's growth being admitted (Admissions.grow): the pod's uid and this.
# Not a pod's uid, so that pod accounting's sweep releases one a crash left behind.
GROWTH_SUFFIX = "+resize"

# How long a deferred release's push waits for more releases on its node to go with it:
# a Job's pods end together, and Slurm gets back what they held 0.2 s later at most.
RELEASE_SETTLE = 0.2

T = TypeVar("T")
# An admission's or a release's flow: it yields each step that may wait on another host
# (slurmrestd) and is sent that step's result; what it returns is the answer. Everything
# else in it is the ledger's local work. ``inline`` and ``Admissions._from_event_loop``
# run it; only the latter hops to a worker thread, and only for those steps.
Flow = Generator[Callable[[], Any], Any, T]


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """One admission asked for, whichever way it came in (REST, extender, GenericNode).
    ``devices``: the GPU devices on the node held by identity (Ledger.admit), never
    inside the headroom: with a gate, always confirmed by it."""

    node: str
    holder: Holder
    requests: Resources
    path: AdmissionPath = "rest"  # the way in, for the metrics
    devices: tuple[HeldDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """One release asked for; ``kind`` None: the holder's holding of either kind."""

    holder_id: str
    kind: HolderKind | None = None
    reason: str = "released"
    path: ReleasePath = "rest"  # the way in (rest, extender, kubernetes), for the metrics


class AdmissionGate(Protocol):
    """An external system that must agree before a hold counts (Slurm, when enabled).
    ``headroom_open`` answers from memory; the others may wait on that system."""

    def confirm(self, holding: Holding) -> str | None:
        """Return when the external system agrees; raise AdmissionRejected otherwise.
        ``holding`` is in the ledger already (PENDING). Returns the id of the Slurm job
        that holds the holding's GPU devices, stored with it, or None."""

    def changed(self, node: str) -> None:
        """Holdings on ``node`` changed without a confirmation (a release, or a pod another
        scheduler bound): bring the external system in line."""

    def headroom_open(self, node: str) -> bool:
        """Whether an admission on ``node`` may use its headroom (app.core.headroom): be
        HELD without ``confirm`` inside what the external system already withholds."""

    def released(self, holding: Holding) -> None:
        """``holding`` left the ledger: end what the external system holds for it alone
        (a GPU pod's hold job)."""

    def defer_push(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        """As ``changed``, off the caller's path (a deferred push, app.slurm.deferred): a
        headroom that ran low, or a release on a node with a headroom (Slurm withholds
        more than needed until then, never less); ``settle``: seconds it may wait, so
        that more changes go with it. Returns at once."""


def advance(flow: Flow[T], result: Any, error: BaseException | None) -> tuple[bool, Any]:
    """One move of a flow, given its last step's result or error: (True, its answer) once
    it is done, else (False, its next step). Shared by both ways of running one."""
    try:
        return False, (flow.send(result) if error is None else flow.throw(error))
    except StopIteration as done:
        return True, done.value


def inline(flow: Flow[T]) -> T:
    """Run a flow to its answer in this thread, each step where it stands."""
    result: Any = None
    error: BaseException | None = None
    while True:
        done, step = advance(flow, result, error)
        if done:
            return step  # type: ignore[no-any-return]
        try:
            result, error = step(), None
        except BaseException as exc:  # the flow's own handlers and context managers see it
            result, error = None, exc


class Admissions:
    def __init__(
        self, ledger: Ledger, gate: AdmissionGate | None = None, *, metrics: Metrics = NO_METRICS
    ) -> None:
        self.ledger = ledger
        self.gate = gate
        self.metrics = metrics
        # With a headroom configured, a release reaches Slurm off the caller's path.
        self._defer_releases = ledger.keeps_headroom()

    def admit(self, request: AdmissionRequest) -> Admission:
        return inline(self._admission(request))

    async def admit_async(self, request: AdmissionRequest) -> Admission:
        """``admit`` for the event loop (see ``_from_event_loop``): on SQLite an admission
        inside the headroom costs no thread hop (~0.5 ms of GIL hand-offs, a third of it)."""
        return await self._from_event_loop(self._admission(request))

    def release(self, request: ReleaseRequest) -> Holding:
        """With a gate, what a confirmed holding frees may stay withheld as its node's
        headroom: then Slurm is not told at all (app.core.headroom.released_target)."""
        return inline(self._release(request))

    async def release_async(self, request: ReleaseRequest) -> Holding:
        """``release`` for the event loop (see ``_from_event_loop``)."""
        return await self._from_event_loop(self._release(request))

    async def _from_event_loop(self, flow: Flow[T]) -> T:
        """The one place that decides the thread hop: whatever may wait on another host
        runs in a worker thread, and only that (each hop costs ~0.5 ms of GIL hand-offs).
        On SQLite the ledger's work runs here and only the steps the flow yields (the
        gate's calls) hop; on PostgreSQL every transaction waits on the network, so the
        whole flow takes one hop."""
        if not self.ledger.runs_locally():
            return await to_thread.run_sync(inline, flow)
        result: Any = None
        error: BaseException | None = None
        while True:
            done, step = advance(flow, result, error)
            if done:
                return step  # type: ignore[no-any-return]
            try:
                result, error = await to_thread.run_sync(step), None
            except BaseException as exc:  # cancellation included: the flow's blocks exit
                result, error = None, exc

    def _admission(self, request: AdmissionRequest) -> Flow[Admission]:
        """1. hold in the ledger; 2. if that is the answer (HELD), done; 3. else the gate
        confirms (the step that waits on slurmrestd)."""
        node, holder = request.node, request.holder
        with log_context(node=node, holder=holder.id), self.metrics.admitting(request.path) as t:
            admission = self._hold(request, t)
            if self._decided(admission):
                return admission
            confirmed: Admission = yield partial(self._confirm, admission, t)
            return confirmed

    def _hold(self, request: AdmissionRequest, timer: AdmissionTimer) -> Admission:
        """The ledger's hold: HELD without a gate or inside the node's headroom, else
        PENDING for the gate to confirm."""
        node, holder, requests = request.node, request.holder, request.requests
        with timer.phase("ledger"):
            if self.gate is None:
                return self.ledger.admit(node, holder, requests, devices=request.devices)
            return self.ledger.admit(
                node,
                holder,
                requests,
                state=HoldingState.PENDING,
                headroom=self.gate.headroom_open(node),
                devices=request.devices,
            )

    def _decided(self, admission: Admission) -> bool:
        """Whether the hold is the answer (HELD); for one inside the headroom, count it and
        have the headroom refilled if it ran low."""
        if admission.holding.state is not HoldingState.HELD:
            return False
        if self.gate is not None:
            if admission.created:  # inside the headroom: no Slurm call
                self.metrics.admitted_within_headroom()
            if admission.refill:
                self._gate_changed(admission.holding.node, later="headroom low")
        return True

    def _confirm(self, admission: Admission, timer: AdmissionTimer) -> Admission:
        """A PENDING holding, new or left by an earlier try: the gate decides either way."""
        assert self.gate is not None
        holder = admission.holding.holder
        try:
            with timer.phase("slurm"):
                slurm_hold = self.gate.confirm(admission.holding)
        except Exception as exc:
            self._undo(holder, exc)
            raise
        with timer.phase("ledger"):
            held = self.ledger.confirm(holder.kind, holder.id, slurm_hold=slurm_hold)
        return Admission(held, admission.created)

    def _undo(self, holder: Holder, cause: Exception) -> None:
        reason = cause.message if isinstance(cause, AdmissionRejected) else f"gate failed: {cause}"
        try:
            holding = self.ledger.release(
                holder.id, holder.kind, reason=f"rejected: {reason}"
            ).holding
        except HoldingNotFound:
            return
        self.ledger.append_event(events.gate_rejected(self.ledger.clock(), holding, reason))
        self._gate_changed(holding.node)

    def _release(self, request: ReleaseRequest) -> Flow[Holding]:
        """1. release in the ledger; 2. tell the gate: inline when that waits on nothing (no
        gate, nothing to tell, a deferred push), else as the step that waits on slurmrestd."""
        with log_context(holder=request.holder_id):
            release = self.ledger.release(
                request.holder_id,
                request.kind,
                reason=request.reason,
                into_headroom=self.gate is not None,
            )
            self.metrics.released(request.path)
            if self._release_waits_on_network(release):
                yield partial(self._released, release)
            else:
                self._released(release)
        return release.holding

    def _release_waits_on_network(self, release: Release) -> bool:
        """Whether telling the gate of ``release`` waits on slurmrestd: a hold job to end,
        or counts to push now (a release pushed later waits on nothing)."""
        if self.gate is None:
            return False
        return release.holding.slurm_hold is not None or (
            release.withheld_fell and not self._defer_releases
        )

    def _released(self, release: Release) -> None:
        """Tell the gate: end the holding's hold job, push what the counts stop
        withholding (now, or later with a headroom configured)."""
        if release.holding.slurm_hold is not None:
            self._gate_released(release.holding)
        if release.withheld_fell:
            later = "released" if self._defer_releases else None
            self._gate_changed(release.holding.node, later=later, settle=RELEASE_SETTLE)

    def record(
        self,
        node: str,
        holder: Holder,
        requests: Resources,
        *,
        reason: str,
        allocated: Resources | None = None,
    ) -> Admission:
        """A pod that is already on ``node`` (bound by another scheduler, or found by a
        resync): the ledger records it without a fit check and Slurm is told. A pod it
        holds there already grows only as far as its kubelet ``allocated`` (``grow``
        admits the rest), and shrinks at once (Ledger.record)."""
        admission = self.ledger.record(node, holder, requests, reason=reason, allocated=allocated)
        if admission.created:
            self._gate_changed(node)
        return admission

    def grow(self, holding: Holding, target: Resources) -> Holding:
        """A pod's in-place growth to ``target``: the difference admitted like any admission,
        as a holding of its own (checked, confirmed by Slurm, racing other admissions under
        the node's lock), then joined to the pod's holding in one transaction. Raises
        AdmissionRejected (or HoldingNotFound: the pod went), the holding as it was."""
        growth = (target - holding.resources).at_least_zero()
        if growth.is_zero():
            return holding
        pod = holding.holder
        part = Holder(pod.kind, pod.id + GROWTH_SUFFIX, f"{pod.display_name} (resize)")
        self.admit(AdmissionRequest(holding.node, part, growth, path="resize"))
        try:
            return self.ledger.resize(pod, part, target, reason="resize admitted")
        except HoldingNotFound:
            with contextlib.suppress(HoldingNotFound):  # the pod went: so does its growth
                self.release(ReleaseRequest(part.id, part.kind, "its pod went", "kubernetes"))
            raise

    def record_many(self, entries: Sequence[Recording], *, reason: str) -> Recorded:
        """record() for many pods in one ledger transaction (a resync); the gate is told
        once per node whose holdings changed."""
        recorded = self.ledger.record_many(entries, reason=reason)
        for node in sorted(recorded.changed):
            self._gate_changed(node)
        return recorded

    def _gate_released(self, holding: Holding) -> None:
        if self.gate is None:
            return
        try:
            self.gate.released(holding)
        except Exception:
            # Released in the ledger either way; the sync ends a hold job no holding names.
            log.exception("ending the Slurm hold of %s failed", holding.holder.id)

    def _gate_changed(self, node: str, *, later: str | None = None, settle: float = 0.0) -> None:
        """Tell the gate, now or (``later``: the reason) off the caller's path."""
        if self.gate is None:
            return
        try:
            with log_context(node=node):
                if later is None:
                    self.gate.changed(node)
                else:
                    self.gate.defer_push(node, later, settle=settle)
        except Exception:
            # The ledger is right either way; the periodic sync pushes the counts again.
            log.exception("telling the gate about a change on %s failed", node)
