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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from app.core.records import HolderKind, Holding, HoldingState
from app.core.slurm_models import SlurmJob
from app.ledger.service import Ledger
from app.slurm.errors import SlurmError
from app.slurm.holds import HoldJob, HoldJobs, holds_in

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
