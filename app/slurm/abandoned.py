"""Holdings whose admission never finished: released, and their node's counts pushed.

A holding still PENDING ``timeout`` seconds after its admission started lost it (its
replica was killed, its client went away before the answer). Released, and the counts
pushed, so Slurm does not withhold it forever. Only the sync leader calls this.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from app.core.ledger_errors import HoldingNotFound
from app.ledger.service import Ledger
from app.slurm.push import Pusher

log = logging.getLogger("app.slurm.sync")  # the sync's lines, under the name they always had

CHECK_EVERY = 10.0  # seconds at most between queries (each reads every holding)


class AbandonedHolds:
    def __init__(
        self,
        ledger: Ledger,
        pusher: Pusher,
        *,
        timeout: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.pusher = pusher
        self.timeout = timeout
        self.monotonic = monotonic
        self._checked = float("-inf")

    def release(self) -> None:
        """Release the abandoned holds, when the last look is old enough."""
        if self.monotonic() - self._checked < min(CHECK_EVERY, self.timeout):
            return
        self._checked = self.monotonic()
        cutoff = self.ledger.clock() - timedelta(seconds=self.timeout)
        for holding in self.ledger.pending_before(cutoff):
            holder = holding.holder
            log.warning("releasing %s on %s: its admission never finished", holder, holding.node)
            with contextlib.suppress(HoldingNotFound):  # finished or released meanwhile
                self.ledger.release(
                    holder.id, holder.kind, reason="abandoned: its admission never finished"
                )
            self.pusher.push(holding.node, reason="release")
