"""Following the ledger's event log in id order without missing a late commit.

PostgreSQL hands out event ids when rows are inserted, not when they commit: a reader can
see id 11 while id 10 is still uncommitted, and reading on "after 11" would skip 10 for
good. So every id a poll steps over is remembered as a gap and looked for again on later
polls until it shows up, or until ``patience`` seconds have passed (a rolled-back
transaction never fills its gap). On SQLite writers serialize, so ids commit in order and
no gap stays open past one poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.core.records import LedgerEvent
from app.ledger.service import Ledger

BATCH = 500
MAX_GAPS = 10_000  # the oldest are given up first
# How far back start() looks for ids not committed yet: more than can be in flight at once.
START_WINDOW = 1000


class EventFollower:
    def __init__(
        self,
        ledger: Ledger,
        *,
        patience: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.patience = patience
        self.monotonic = monotonic
        self.last_id: int | None = None
        self.given_up = 0  # gaps dropped unfilled: changes this follower may have missed
        self._gaps: dict[int, float] = {}  # event id -> when it was first missed

    def start(self) -> None:
        """Start at the end of the log, as the first poll would, but also look for the ids
        below it that are not committed yet: what a reader of the ledger could not see
        when this was called can still show up later, and poll() returns it then."""
        last = self.ledger.last_event_id()
        first = max(1, last - START_WINDOW + 1)
        committed = {e.id for e in self.ledger.events_after(first - 1, START_WINDOW)}
        now = self.monotonic()
        self._gaps = {i: now for i in range(first, last + 1) if i not in committed}
        self.last_id = last

    def poll(self) -> list[LedgerEvent]:
        """Events committed since the last poll (the first poll starts at the log's end)."""
        if self.last_id is None:
            self.last_id = self.ledger.last_event_id()
            return []
        now = self.monotonic()
        found = self._filled_gaps(now)
        while events := self.ledger.events_after(self.last_id, BATCH):
            for event in events:
                for missing in range(self.last_id + 1, event.id):
                    self._gaps[missing] = now
                self.last_id = event.id
            found.extend(events)
            if len(events) < BATCH:
                break
        while len(self._gaps) > MAX_GAPS:
            del self._gaps[next(iter(self._gaps))]
            self.given_up += 1
        return found

    def _filled_gaps(self, now: float) -> list[LedgerEvent]:
        if not self._gaps:
            return []
        filled = self.ledger.events_with_ids(list(self._gaps))
        for event in filled:
            del self._gaps[event.id]
        for missing, since in list(self._gaps.items()):
            if now - since > self.patience:
                del self._gaps[missing]
                self.given_up += 1
        return filled
