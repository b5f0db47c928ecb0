"""Ledger -> Slurm: keep each node's k8scpu/k8smemory/k8sgpu counts (and the ``extra``
token the node_features plugin reads) equal to what the ledger withholds from Slurm.

One push is two slurmrestd calls: the update, computed from the node as this process last
read it back (CPUs, memory and the rest of the GRES string change only by reconfiguration),
and a read-back of that one node, which the gate's safety check needs anyway
(app.slurm.gate). When the read-back shows other counts (slurmctld restarted, another
replica pushed, the node was resized) the push goes again from what it read; when the
counts are already right it is one read.

Concurrency contract: a push is read-ledger -> update -> read-back while holding the
node against every replica (``Ledger.exclusive``, app.db.locks), so at most one push to a
node is in flight anywhere and each computes from the ledger as it is once it holds the
node: a late or repeated push can never restore stale counts, from this replica or
another. Within a replica pushes to a node are also coalesced: a caller whose ledger
change was committed before it called ``push`` returns as soon as any push that read the
ledger after that call has finished, so a burst of admissions on one node costs a few
updates, not one each.

A push that fails (Slurm unreachable, an admission let through by ``fail_open``) leaves the
node *owed*: the sync pushes owed nodes on its next step that reaches Slurm, so counts
that changed only in the ledger are not left waiting for Slurm itself to change.

An update whose answer was lost (the client's timeout shorter than slurmrestd's or
slurmctld's; ``SlurmAnswerLost``) may still be applied later, after a newer push that read
back the right counts: the node lock orders the pushes we send, not when slurmctld applies
them, and Slurm has no conditional update. Every update is the node's full state, so a late
one restores stale counts only when something newer was acknowledged meanwhile. So such a
node stays owed for ``late_window`` seconds (longer than slurmrestd and slurmctld keep a
request) even when later pushes succeed: the sync reads it back on each step meanwhile,
and pushes again if a late update landed, whatever the listings say (with job hints they
come only every full sync interval). A push that succeeds after the window clears it. The
same late landing from a replica that lost its leadership is left to the new leader's
listings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from app.core.counts import (
    SlurmUnits,
    current_counts,
    desired_counts,
    extra_with_holdings,
    fence_kept,
    gres_update,
    gres_usage,
    held_units,
    hides_usage,
    in_place,
    read_back_grant,
    slurm_grant,
    slurm_usage,
    withheld,
)
from app.core.records import NodeView
from app.core.resources import Resources
from app.core.slurm_comment import node_comment, ours
from app.core.slurm_models import LedgerHolds, SlurmJob, SlurmNode
from app.ledger import events
from app.ledger.service import Ledger
from app.metrics.registry import NO_METRICS, Metrics
from app.slurm.client import SlurmClient
from app.slurm.errors import (
    SlurmAnswerLost,
    SlurmError,
    SlurmRequestError,
    SlurmUnavailable,
)
from app.slurm.witness import SlurmWitness

log = logging.getLogger(__name__)

MAX_ROUNDS = 4  # a read, then update + read back, again if it shows other counts (a reset)
# How long an update whose answer was lost may still be applied: slurmrestd's and slurmctld's
# timeouts (MessageTimeout, 10 s by default) with room to spare.
LATE_WINDOW_SECONDS = 30.0


Check = Callable[[NodeView], None]


@dataclass(frozen=True, slots=True)
class PushResult:
    view: NodeView  # the ledger's node the push computed from (held against every replica)
    node: SlurmNode  # as read back from Slurm after the push
    withheld: SlurmUnits  # what the push withheld from Slurm: held + the headroom's target
    held: SlurmUnits  # what pods and reservations hold of it
    used: SlurmUnits  # what Slurm's jobs use on the node, read after the push
    updated: bool  # False when Slurm already had the right counts
    drifted: bool  # Slurm had other counts than this service last pushed (reset behind us)


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requested: int = 0
    covered: int = 0  # every request numbered up to this is covered by a finished push
    last: PushResult | None = None


class Pusher:
    late_window: float = LATE_WINDOW_SECONDS
    _now: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(
        self,
        client: SlurmClient,
        ledger: Ledger,
        *,
        metrics: Metrics = NO_METRICS,
        witness: SlurmWitness | None = None,
        marked: bool = False,
    ) -> None:
        """``witness``: whether grants may be used without Slurm (app.slurm.witness); a push
        that finds slurmrestd away raises doubt, and one whose read-back came before a
        doubt raises no grant. ``marked``: every node's ``extra`` carries the marker jobs'
        extra constraints name, so that jobs queue behind pods (app.core.counts)."""
        self.jobs_queue = marked
        self.marked = marked
        self.client = client
        self.ledger = ledger
        self.metrics = metrics
        self.witness = witness
        self._slots: dict[str, _Slot] = {}
        self._counter_lock = threading.Lock()
        self._owed: set[str] = set()  # nodes whose last push failed
        # Per node: until when an update whose answer was lost may still land (monotonic).
        self._late_until: dict[str, float] = {}

    def keep_marker(self, needed: bool) -> None:
        """``needed``: a job pends on the marker (its extra constraint, given while the jobs
        queue was on). Every node then keeps it, the setting off too: without it no node
        meets the constraint and the job pends for ever. Jobs submitted meanwhile get the
        constraint as well (the job_submit plugin sees every node marked), so the marker
        goes once none is left pending; a restart reads it again from the next listing."""
        marked = self.jobs_queue or needed
        if marked != self.marked and not self.jobs_queue:
            log.info(
                "jobs queue off: the nodes' marker %s",
                "kept, jobs pend on it" if marked else "goes, no job pends on it",
            )
        self.marked = marked

    def owed(self) -> list[str]:
        """Nodes whose last push failed: Slurm may not withhold what the ledger does."""
        with self._counter_lock:
            return sorted(self._owed)

    def push(
        self,
        node: str,
        *,
        reason: str = "ledger changed",
        check: Check | None = None,
        observed: SlurmNode | None = None,
        observed_jobs: Collection[SlurmJob] = (),
        hold: str | None = None,
    ) -> PushResult:
        """``check`` sees the ledger's node as the push computes from it, before anything is
        sent to Slurm (when another caller's push covers this call: as that push read it);
        what it raises ends the push (the gate's cap: no over-cap counts pushed first).
        ``observed``: the node as a listing found it, when Slurm may have lost the counts
        (the headroom's grant is lowered to what that leaves before anything else), and
        ``observed_jobs`` the jobs that listing found on it. ``hold``: the hold job the
        caller made for a holding of the node and has not recorded yet (the gate's): the
        pod's, not a Slurm job's, in ``used``; such a push is never covered by another's,
        which counted it as Slurm's."""
        with self._counter_lock:
            slot = self._slots.setdefault(node, _Slot())
            slot.requested += 1
            ticket = slot.requested
        with slot.lock:
            if slot.covered >= ticket and slot.last is not None and hold is None:
                self.metrics.slurm_push_coalesced()
                if check is not None:
                    check(slot.last.view)
                return slot.last
            with self._counter_lock:
                start = slot.requested  # this push reads the ledger after all these requests
            try:
                result = self._push_now(node, reason, slot, check, (observed, observed_jobs), hold)
            except SlurmError as exc:
                with self._counter_lock:
                    self._owed.add(node)
                    if isinstance(exc, SlurmAnswerLost):
                        self._late_until[node] = self._now() + self.late_window
                if self.witness is not None and isinstance(exc, SlurmUnavailable):
                    self.witness.doubt(f"Slurm unreachable: {exc.message}")
                raise
            with self._counter_lock:
                if self._late_until.get(node, 0.0) <= self._now():  # nothing late to come
                    self._late_until.pop(node, None)
                    self._owed.discard(node)
            slot.covered, slot.last = start, result
            return result

    def _push_now(
        self,
        name: str,
        reason: str,
        slot: _Slot,
        check: Check | None,
        observed: tuple[SlurmNode | None, Collection[SlurmJob]],
        hold: str | None,
    ) -> PushResult:
        pushed: list[str] = []
        drifted = False
        generation = self.witness.generation if self.witness is not None else 0
        with self.ledger.exclusive(name) as exclusive:
            # The grant first: no admission may skip Slurm beyond what this push withholds,
            # nor beyond what a listing found Slurm withholding (app.core.headroom).
            view = exclusive.view(
                grant_at_most=lambda v: _grant_limit(v, *observed, self._holds(v))
            )
            if check is not None:
                check(view)
            self.metrics.slurm_pushed(reason)  # a push that runs (the check let it)
            held = withheld(view)
            # What is written starts from a fresh read: an administrator may have written
            # the comment or Extra since the last read-back (their text is kept), and a
            # reconfiguration the GRES. ``known`` (that read-back) only tells drift.
            known = slot.last.node if slot.last is not None else None  # as this process left it
            node = None
            for _ in range(MAX_ROUNDS):
                if node is not None and not in_place(node, held, marked=self.marked):
                    gres = gres_update(node, desired_counts(node, held))
                    extra = extra_with_holdings(node.extra, held, marked=self.marked)
                    self.client.update_node(
                        view.slurm_name,
                        gres=gres,
                        extra=extra if extra != node.extra else None,
                        comment=_comment_update(node, view, held),
                    )
                    pushed.append(gres)
                # Read after the update: what the gate's safety check needs (app.slurm.gate).
                node = self.client.get_node(view.slurm_name)
                held = fence_kept(view, held, node, observed[0])
                if not pushed and known is not None:
                    drifted = drifted or current_counts(node) != current_counts(known)
                if in_place(node, held, marked=self.marked):
                    break
            else:
                raise SlurmRequestError(
                    f"Slurm node {view.slurm_name} did not keep the counts pushed to it "
                    f"({', '.join(pushed)}) after {MAX_ROUNDS} tries"
                )
            used = self._used(node, self._holds(view).also(hold))
            granted = read_back_grant(view, node, used)
            if self.witness is not None and self.witness.generation != generation:
                # Slurm may have changed the counts since this read (app.slurm.witness):
                # the grant may fall, never rise, on it.
                granted = granted.at_most(view.headroom.granted)
            event = None
            if pushed:
                event = events.slurm_pushed(
                    self.ledger.clock(), name, view.slurm_name, pushed[-1], reason, _units(held)
                )
                log.debug("pushed %s to %s (%s)", pushed[-1], view.slurm_name, reason)
            exclusive.finish(granted if granted != view.headroom.granted else None, event)
        return PushResult(
            view, node, held, held_units(view), used, updated=bool(pushed), drifted=drifted
        )

    def _holds(self, view: NodeView) -> LedgerHolds:
        """The hold jobs the ledger recorded on the node ``view`` shows (its Slurm user's)."""
        return LedgerHolds.of(self.client.user_name, view.holdings)

    def _used(self, node: SlurmNode, holds: LedgerHolds) -> SlurmUnits:
        """What Slurm's jobs use on ``node`` as just read back; where a count of 0 hides it
        (app.core.counts.hides_usage), from a job listing read after that: every job that
        started before the counts landed is in it, but the ledger's ``holds``."""
        if not hides_usage(node):
            return gres_usage(node)
        listing = self.client.get_jobs()
        return slurm_usage(node, listing.items if listing is not None else (), holds)

    def void_grant(self, name: str) -> None:
        """Lower the node's grant to zero, committed, under the node's lock against every
        replica (a push in flight finishes first): what Slurm withholds is unknown until a
        read-back shows it again (app.slurm.witness)."""
        with self.ledger.exclusive(name) as exclusive:
            exclusive.view(grant_at_most=lambda _: Resources.ZERO)


def _grant_limit(
    view: NodeView, observed: SlurmNode | None, jobs: Collection[SlurmJob], holds: LedgerHolds
) -> Resources:
    """What a push leaves the node's grant at most: what it will withhold and, after a
    listing that may show lost counts, what that listing found Slurm leaving to pods."""
    limit = withheld(view).as_resources()
    if observed is None:
        return limit
    return limit.at_most(slurm_grant(observed, slurm_usage(observed, jobs, holds)))


def _comment_update(node: SlurmNode, view: NodeView, held: SlurmUnits) -> str | None:
    """The node's comment naming who holds what is withheld (app.core.slurm_comment), when
    it changes and is the service's to write. It rides on a count update only: the counts
    are what keeps jobs off, so a comment never costs a call of its own, and is as of the
    last count change."""
    comment = node_comment(view, held)
    return comment if ours(node.comment) and comment != node.comment else None


def _units(held: SlurmUnits) -> dict[str, int]:
    return {"cpus": held.cpus, "memory_mb": held.memory_mb, "gpus": held.gpus}
