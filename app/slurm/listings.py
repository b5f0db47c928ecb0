"""When Slurm's full listings of nodes and jobs are read, and how they reach the cache.

Each listing asks ``?update_time=`` (an unchanged cluster answers 304, costs nothing).
Without ``full_sync_interval``: both listings every step, read in the sync's thread. With it
(slurmctld sends job hints): read that often in the background (at 15,000 nodes one takes
over a minute) and applied in the sync's thread once read, so the cache keeps one owner. A
changed slurmctld start time (``GET diag/``, each step), or a flood of hints, makes the next
listing full (no ``update_time``) and starts it at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime

from app.ledger.clock import Clock, utcnow
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmError
from app.slurm.state import Listings, SlurmState

log = logging.getLogger("app.slurm.sync")  # the sync's lines, under the name they always had


class ListingReader:
    def __init__(
        self,
        client: SlurmClient,
        state: SlurmState,
        *,
        full_sync_interval: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Clock = utcnow,
    ) -> None:
        """``clock``: the ledger's, in which ``jobs_listed_at`` is told."""
        self.client = client
        self.state = state
        self.full_sync_interval = full_sync_interval
        self.monotonic = monotonic
        self.clock = clock
        # When the last full job listing's read began, in the ledger's clock: read then, as
        # the holdings it is compared with were stamped (app.core.plan).
        self.jobs_listed_at: datetime | None = None
        self._nodes_time = 0
        self._jobs_time = 0
        self.pending: Future[Listings] | None = None  # a background read under way
        self._started = 0.0
        self._started_at: datetime | None = None  # the same moment in the ledger's clock
        self._due = float("-inf")
        self._full_due = False  # a flood of hints, or slurmctld restarted
        self._ctld_started: int | None = None
        self._reader: ThreadPoolExecutor | None = None

    def force_full(self) -> None:
        """Make the next listing full, and start it at the next step."""
        self._full_due = True

    def close(self) -> None:
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)

    def read(self, started: int | None = None) -> bool:
        """Whether a listing brought news (applied to the cache). Raises SlurmError.
        ``started``: slurmctld's start time if the caller just read it (else read here)."""
        if self.full_sync_interval is None:
            began, began_at = self.monotonic(), self.clock()
            return self._apply(self._read_listings(), began, began_at)
        if self._restarted(started):
            self._full_due = True
        if self.pending is None:
            if self._full_due or self.monotonic() >= self._due:
                if self._full_due:
                    self._nodes_time = self._jobs_time = 0
                self._full_due = False
                self._started, self._started_at = self.monotonic(), self.clock()
                self._reader = self._reader or ThreadPoolExecutor(1, "slurm-listing")
                self.pending = self._reader.submit(self._read_listings)
            return False
        if not self.pending.done():
            return False
        listing, self.pending = self.pending, None
        try:
            listings = listing.result()
        except SlurmError:
            self._due = float("-inf")  # again at the next step
            raise
        self._due = self._started + self.full_sync_interval
        return self._apply(listings, self._started, self._started_at)

    def _restarted(self, started: int | None) -> bool:
        if started is None:
            started = self.client.started_at()
        restarted = self._ctld_started is not None and started != self._ctld_started
        if restarted:
            log.info("slurmctld restarted: a full listing now")
        self._ctld_started = started
        return restarted

    def _read_listings(self) -> Listings:
        return (
            self.client.get_nodes(self._nodes_time or None),
            self.client.get_jobs(self._jobs_time or None),
        )

    def _apply(self, listings: Listings, began: float, began_at: datetime | None) -> bool:
        nodes, jobs = listings
        if nodes is not None:
            self._nodes_time = nodes.last_update
        if jobs is not None:
            self._jobs_time = jobs.last_update
            self.jobs_listed_at = began_at
        return self.state.apply_listings(listings, began)
