"""Hold jobs that no holding names, ended by the Slurm sync's leader.

A hold job (app.slurm.holds) outlives its holding when the service stopped between Slurm's
allocation and the ledger's commit, when an allocation's answer was lost, or when a
release's cancel failed. Until it ends it keeps a device, CPUs and memory from Slurm's jobs
for a pod that is gone: never unsafe, but a loss to Slurm. So each time the sync reads a new
listing, the leader compares the hold jobs in it with the ledger's holdings and ends every
hold whose holder has no holding that names it. Only the service's own jobs are hold jobs
here (its Slurm user's, marked as app.slurm.holds marks them): another user's job is never
ended, whatever its name or comment.

A holder whose holding is still PENDING with no hold recorded is mid-admission (between the
hold and the commit) and keeps its hold; if that admission was abandoned, its holding is
released after the pending timeout (app.slurm.abandoned), and the next sweep ends the hold.

The other way round, a holding whose hold job Slurm has lost (an operator's scancel,
slurmd down long enough for Slurm to end its jobs) leaves the pod's device to any job:
less often (every full pass), the leader holds such devices again, and records the new
hold. If a job took a device meanwhile the hold is refused; that conflict is recorded as
drift, logged and reported in the sync's health until the pod or the job goes: only a
person can say which of the two should give way.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from app.core.errors import NodeledgerError
from app.core.ledger_errors import AdmissionRejected, HoldingNotFound
from app.core.plan import hold_gone
from app.core.records import EventKind, HolderKind, Holding
from app.core.slurm_models import LedgerHolds, SlurmJob
from app.ledger.service import Ledger
from app.slurm.errors import SlurmError
from app.slurm.holds import HoldJob, HoldJobs, hold_for, holds_in

log = logging.getLogger(__name__)


def orphans(holds: Iterable[HoldJob], holdings: Iterable[Holding]) -> list[HoldJob]:
    """The holds no holding names (pure): a holder without a holding, or whose holdings all
    name other holds. Holdings are matched per holder id, every kind at once (a pod and a
    manual holding may share an id), and a holding that names no hold keeps its holder's:
    one PENDING mid-admission (between the hold and the commit), or one replaced without its
    devices while its pod runs on them (an in-place resize, a bind whose answer was lost, a
    ledger rebuilt): that hold ends with the holding, not before."""
    named: dict[str, set[str | None]] = defaultdict(set)
    for holding in holdings:
        named[holding.holder.id].add(holding.slurm_hold)
    found = []
    for hold in holds:
        names = named.get(hold.holder_id, set())
        if hold.job_id not in names and None not in names:
            found.append(hold)
    return found


def lost(holdings: Iterable[Holding], holds: Iterable[HoldJob], before: datetime) -> list[Holding]:
    """The holdings whose hold job is not among ``holds`` (pure); only those confirmed
    before ``before``, which the listing ``holds`` came from is sure to show, and naming
    devices (a hold names at least one)."""
    running = {h.job_id for h in holds}
    return [h for h in holdings if hold_gone(h, running, before)]


def ending(jobs: Iterable[SlurmJob], user: str) -> set[str]:
    """The hold jobs of ``user`` (the service's) among ``jobs`` that are ending already
    (COMPLETING: cancelled, their epilog under way on 24.11): nobody need cancel them again."""
    ours = LedgerHolds(user)
    return {j.job_id for j in jobs if ours.holder_of(j) is not None and "COMPLETING" in j.states}


class HoldSweep:
    def __init__(self, holds: HoldJobs, ledger: Ledger) -> None:
        self.holds = holds
        self.ledger = ledger
        # Orphans seen by the last sweep: a hold is ended only when two listings in a row
        # show it orphaned, so that a release's own cancel (its holding deleted a moment
        # before) is not raced by a second one and a warning.
        self._suspects: set[str] = set()

    def sweep(self, jobs: Iterable[SlurmJob]) -> list[str]:
        """End the orphaned holds among ``jobs`` (the sync's listing); failures, by job."""
        jobs = list(jobs)
        user = self.holds.user
        done = ending(jobs, user)
        running = {k: h for k, h in holds_in(jobs, user).items() if k not in done}
        if not running:
            self._suspects = set()
            return []
        holders = {h.holder_id for h in running.values()}
        holdings = [
            h
            for kind in (HolderKind.POD, HolderKind.MANUAL)
            for h in self.ledger.holdings_of(kind, holders)
        ]
        found = orphans(running.values(), holdings)
        confirmed = [h for h in found if h.job_id in self._suspects]
        self._suspects = {h.job_id for h in found} - {h.job_id for h in confirmed}
        failures = []
        for hold in confirmed:
            log.warning(
                "ending Slurm hold job %s of %s on %s: no holding names it",
                hold.job_id,
                hold.holder_id,
                hold.slurm_node,
            )
            try:
                self.holds.cancel(hold.job_id, slurm_node=hold.slurm_node)
            except SlurmError as exc:
                failures.append(f"hold job {hold.job_id}: {exc}")
        return failures

    def hold_lost(self, jobs: Iterable[SlurmJob], listed_at: datetime) -> list[str]:
        """Hold again the devices of holdings whose hold job is gone (``jobs``: a listing
        read from ``listed_at`` on); failures and conflicts, by holder."""
        failures = []
        running = holds_in(jobs, self.holds.user).values()
        for holding in lost(self.ledger.held_in_slurm(), running, listed_at):
            try:
                self._hold_again(holding)
            except NodeledgerError as exc:
                failures.append(f"{holding.holder.id}: {exc}")
        return failures

    def _hold_again(self, holding: Holding) -> None:
        node = self.ledger.get_node(holding.node)
        holder = holding.holder.display_name or holding.holder.id
        what = f"Slurm hold job {holding.slurm_hold} of {holder}"
        details = {"holder_id": holding.holder.id, "devices": list(holding.device_indices)}
        try:
            job = hold_for(self.holds, node.slurm_name, holding)
        except AdmissionRejected as exc:
            message = f"{what} is gone and its GPU devices cannot be held again: {exc.message}"
            log.error("%s", message)
            self.ledger.record_event(EventKind.SLURM_DRIFT, holding.node, message, details)
            raise
        try:
            self.ledger.confirm(holding.holder.kind, holding.holder.id, slurm_hold=job)
        except HoldingNotFound:
            self.holds.cancel(job, slurm_node=node.slurm_name)  # released meanwhile
            return
        message = (
            f"{what} is gone: GPU devices {list(holding.device_indices)} held again by job {job}"
        )
        log.warning("%s", message)
        self.ledger.record_event(
            EventKind.SLURM_DRIFT, holding.node, message, {**details, "slurm_hold": job}
        )
