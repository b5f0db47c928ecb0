"""Hold jobs that no holding names, ended by the Slurm sync's leader (issue 23).

A hold job (app.slurm.holds) outlives its holding when the service stopped between Slurm's
allocation and the ledger's commit, when an allocation's answer was lost, or when a
release's cancel failed. Until it ends it keeps a device, CPUs and memory from Slurm's jobs
for a pod that is gone: never unsafe, but a loss to Slurm. So each time the sync reads a new
listing, the leader compares the hold jobs in it with the ledger's holdings and ends every
hold whose holder has no holding that names it.

A holder whose holding is still PENDING with no hold recorded is mid-admission (between the
hold and the commit) and keeps its hold; if that admission was abandoned, its holding is
released after the pending timeout (app.slurm.abandoned), and the next sweep ends the hold.

The other way round, a holding whose hold job Slurm no longer has (an operator's scancel,
slurmd down long enough for Slurm to end its jobs) leaves the pod's device to any job:
less often (every full pass), the leader holds such devices again, and records the new
hold. If a job took a device meanwhile the hold is refused; that conflict is recorded as
drift, logged and reported in the sync's health until the pod or the job goes: only a
person can say which of the two should give way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from app.core.ledger_errors import AdmissionRejected, HoldingNotFound, LedgerError
from app.core.records import EventKind, HolderKind, Holding, HoldingState
from app.core.slurm_models import SlurmJob
from app.ledger.service import Ledger
from app.slurm.errors import SlurmError
from app.slurm.holds import HoldJob, HoldJobs, hold_for, holds_in

log = logging.getLogger(__name__)


def orphans(holds: Iterable[HoldJob], holdings: Iterable[Holding]) -> list[HoldJob]:
    """The holds no holding names (pure): a holder without a holding, or whose holding
    names another hold; not one whose holding is PENDING with none recorded yet."""
    by_holder = {h.holder.id: h for h in holdings}
    found = []
    for hold in holds:
        holding = by_holder.get(hold.holder_id)
        if holding is None or (
            holding.slurm_hold != hold.job_id
            and not (holding.slurm_hold is None and holding.state is HoldingState.PENDING)
        ):
            found.append(hold)
    return found


def lost(holdings: Iterable[Holding], holds: Iterable[HoldJob], before: datetime) -> list[Holding]:
    """The holdings whose hold job is not among ``holds`` (pure); only those confirmed
    before ``before``, which the listing ``holds`` came from is sure to show."""
    running = {h.job_id for h in holds}
    return [h for h in holdings if h.slurm_hold not in running and h.updated_at < before]


class HoldSweep:
    def __init__(self, holds: HoldJobs, ledger: Ledger) -> None:
        self.holds = holds
        self.ledger = ledger

    def sweep(self, jobs: Iterable[SlurmJob]) -> list[str]:
        """End the orphaned holds among ``jobs`` (the sync's listing); failures, by job."""
        running = holds_in(jobs)
        if not running:
            return []
        holders = {h.holder_id for h in running.values()}
        holdings = [
            h
            for kind in (HolderKind.POD, HolderKind.MANUAL)
            for h in self.ledger.holdings_of(kind, holders)
        ]
        failures = []
        for hold in orphans(running.values(), holdings):
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
        for holding in lost(self.ledger.held_in_slurm(), holds_in(jobs).values(), listed_at):
            try:
                self._hold_again(holding)
            except (SlurmError, LedgerError) as exc:
                failures.append(f"{holding.holder.id}: {exc}")
        return failures

    def _hold_again(self, holding: Holding) -> None:
        node = self.ledger.get_node(holding.node)
        holder = holding.holder.display_name or holding.holder.id
        what = f"Slurm hold job {holding.slurm_hold} of {holder}"
        details = {"holder_id": holding.holder.id, "devices": list(holding.devices)}
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
        message = f"{what} is gone: GPU devices {list(holding.devices)} held again by job {job}"
        log.warning("%s", message)
        self.ledger.record_event(
            EventKind.SLURM_DRIFT, holding.node, message, {**details, "slurm_hold": job}
        )
