"""Admission = hold in the ledger, then let an external gate (Slurm) confirm the hold.

1. Hold: the ledger's atomic check-and-hold, as PENDING when a gate must confirm; HELD at
   once when it fits what the gate's system already withholds (the headroom,
   app.core.headroom), and then the gate is asked to refill that, later, if it ran low.
2. Confirm: the gate tells the external system and checks it agrees (e.g. pushes the
   lowered k8scpu counts and reads the node back).
3. On refusal, undo the hold and tell the gate to restore what it pushed; on success,
   mark the holding HELD.
A release removes the holding, ends its hold job if it has one (GPU devices, issue 23),
then tells the gate (off the caller's path with a headroom configured) unless what it
freed stayed withheld as its node's headroom; recording a pod
that another scheduler already bound tells the gate too (the ledger takes the truth,
Slurm must follow).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Protocol

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

# How long a deferred release's push waits for more releases on its node to go with it:
# a Job's pods end together, and Slurm gets back what they held 0.2 s later at most.
RELEASE_SETTLE = 0.2


class AdmissionGate(Protocol):
    """An external system that must agree before a hold counts (Slurm, when enabled)."""

    def confirm(self, holding: Holding) -> str | None:
        """Return when the external system agrees; raise AdmissionRejected otherwise.
        ``holding`` is in the ledger already (PENDING). Returns the id of the Slurm job
        that holds the holding's GPU devices (issue 23), stored with it, or None."""

    def changed(self, node: str) -> None:
        """Holdings on ``node`` changed without a confirmation (a release, or a pod another
        scheduler bound): bring the external system in line."""

    def headroom_open(self, node: str) -> bool:
        """Whether an admission on ``node`` may use its headroom (app.core.headroom): be
        HELD without ``confirm`` inside what the external system already withholds."""

    def released(self, holding: Holding) -> None:
        """``holding`` left the ledger: end what the external system holds for it alone
        (a GPU pod's hold job, issue 23)."""

    def changed_later(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        """As ``changed``, off the caller's path: a headroom that ran low, or a release on
        a node with a headroom (Slurm withholds more than needed until then, never less);
        ``settle``: seconds it may wait, so that more changes go with it."""


class Admissions:
    def __init__(
        self, ledger: Ledger, gate: AdmissionGate | None = None, *, metrics: Metrics = NO_METRICS
    ) -> None:
        self.ledger = ledger
        self.gate = gate
        self.metrics = metrics
        # With a headroom configured, a release reaches Slurm off the caller's path.
        self._defer_releases = not ledger.headroom.amount.is_zero()

    @property
    def holds_locally(self) -> bool:
        """Whether the ledger's own part of an admission or release is a sub-millisecond
        local transaction (SQLite), fit to run on the event loop."""
        return self.ledger.db.is_sqlite

    @property
    def waits_on_network(self) -> bool:
        """Whether admit/release may wait on another host (slurmrestd, PostgreSQL). If not
        (an SQLite ledger, no gate), each is a sub-millisecond local transaction."""
        return self.gate is not None or not self.holds_locally

    def admit(
        self,
        node: str,
        holder: Holder,
        requests: Resources,
        *,
        path: AdmissionPath = "rest",
        devices: tuple[HeldDevice, ...] = (),
    ) -> Admission:
        """``path``: the way in, for the metrics (rest, extender, genericnode); ``devices``:
        the GPU devices on the node held by identity (Ledger.admit), never inside the
        headroom: with a gate, always confirmed by it."""
        with log_context(node=node, holder=holder.id), self.metrics.admitting(path) as timer:
            admission = self._hold(node, holder, requests, timer, devices)
            if self._decided(admission):
                return admission
            return self._confirm(admission, timer)

    async def admit_async(
        self,
        node: str,
        holder: Holder,
        requests: Resources,
        *,
        path: AdmissionPath = "rest",
        devices: tuple[HeldDevice, ...] = (),
    ) -> Admission:
        """``admit`` for the event loop: whatever may wait on another host runs in a worker
        thread, and only that. On SQLite the ledger's hold runs here, so an admission inside
        the headroom costs no thread hop (~0.5 ms of GIL hand-offs, a third of it)."""
        if not self.waits_on_network:
            return self.admit(node, holder, requests, path=path, devices=devices)
        if not self.holds_locally:
            admit = partial(self.admit, node, holder, requests, path=path, devices=devices)
            return await to_thread.run_sync(admit)
        with log_context(node=node, holder=holder.id), self.metrics.admitting(path) as timer:
            admission = self._hold(node, holder, requests, timer, devices)
            if self._decided(admission):
                return admission
            return await to_thread.run_sync(self._confirm, admission, timer)

    def _hold(
        self,
        node: str,
        holder: Holder,
        requests: Resources,
        timer: AdmissionTimer,
        devices: tuple[HeldDevice, ...],
    ) -> Admission:
        """The ledger's hold: HELD without a gate or inside the node's headroom, else
        PENDING for the gate to confirm."""
        with timer.phase("ledger"):
            if self.gate is None:
                return self.ledger.admit(node, holder, requests, devices=devices)
            return self.ledger.admit(
                node,
                holder,
                requests,
                state=HoldingState.PENDING,
                headroom=self.gate.headroom_open(node),
                devices=devices,
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

    def release(
        self,
        holder_id: str,
        kind: HolderKind | None = None,
        *,
        reason: str = "released",
        path: ReleasePath = "rest",
    ) -> Holding:
        """``path``: the way in, for the metrics (rest, extender, kubernetes). With a gate,
        what a confirmed holding frees may stay withheld as its node's headroom: then Slurm
        is not told at all (app.core.headroom.released_target)."""
        with log_context(holder=holder_id):
            release = self._release(holder_id, kind, reason, path)
            self._released(release)
        return release.holding

    async def release_async(
        self,
        holder_id: str,
        kind: HolderKind | None = None,
        *,
        reason: str = "released",
        path: ReleasePath = "rest",
    ) -> Holding:
        """``release`` for the event loop: in a worker thread only what may wait on another
        host (the worker-thread hop costs ~0.5 ms of GIL hand-offs)."""
        if not self.holds_locally:
            call = partial(self.release, holder_id, kind, reason=reason, path=path)
            return await to_thread.run_sync(call)
        with log_context(holder=holder_id):
            release = self._release(holder_id, kind, reason, path)
            if self._release_waits_on_network(release):
                await to_thread.run_sync(self._released, release)
            else:
                self._released(release)
        return release.holding

    def _release(
        self, holder_id: str, kind: HolderKind | None, reason: str, path: ReleasePath
    ) -> Release:
        release = self.ledger.release(
            holder_id, kind, reason=reason, into_headroom=self.gate is not None
        )
        self.metrics.released(path)
        return release

    def _release_waits_on_network(self, release: Release) -> bool:
        """Whether telling the gate of ``release`` waits on slurmrestd: a hold job to end,
        or counts to push now (a release pushed later waits on nothing)."""
        if self.gate is None:
            return False
        return release.holding.slurm_hold is not None or (
            release.withheld_fell and not self._defer_releases
        )

    def _released(self, release: Release) -> None:
        """Tell the gate: end the holding's hold job, push what the counts no longer
        withhold (now, or later with a headroom configured)."""
        if release.holding.slurm_hold is not None:
            self._gate_released(release.holding)
        if release.withheld_fell:
            later = "released" if self._defer_releases else None
            self._gate_changed(release.holding.node, later=later, settle=RELEASE_SETTLE)

    def record(self, node: str, holder: Holder, requests: Resources, *, reason: str) -> Admission:
        """A pod that is already on ``node`` (bound by another scheduler, or found by a
        resync): the ledger records it without a fit check and Slurm is told."""
        admission = self.ledger.record(node, holder, requests, reason=reason)
        if admission.created:
            self._gate_changed(node)
        return admission

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
                    self.gate.changed_later(node, later, settle=settle)
        except Exception:
            # The ledger is right either way; the periodic sync pushes the counts again.
            log.exception("telling the gate about a change on %s failed", node)
