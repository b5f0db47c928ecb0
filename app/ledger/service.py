"""The ledger's public entry point: ``Ledger`` is its reads (app.ledger.queries) and its
changes (app.ledger.commands) on one database, so that callers hold one object.

Where the rest lives: the admission decision is app.core.decision; event texts are
app.ledger.events; which SQL path a transaction takes is app.ledger.store; every node
view in memory, and who changed, is app.ledger.snapshot.
"""

from __future__ import annotations

from app.core.headroom import NO_POLICY, HeadroomPolicy
from app.core.records import Admission, SnapshotEntry
from app.db.engine import Database
from app.ledger.clock import Clock, utcnow
from app.ledger.commands import LedgerCommands
from app.ledger.queries import LedgerQueries
from app.ledger.store import Store

__all__ = ["Admission", "Clock", "Ledger", "SnapshotEntry", "utcnow"]


class Ledger(LedgerQueries, LedgerCommands):
    def __init__(
        self, db: Database, clock: Clock = utcnow, *, headroom: HeadroomPolicy = NO_POLICY
    ) -> None:
        """``headroom``: the Kubernetes headroom's policy (app.core.headroom), applied to
        admissions a gate confirms."""
        store = Store(db, clock)
        LedgerQueries.__init__(self, store)
        LedgerCommands.__init__(self, store, clock, headroom)
        self.db = db

    def runs_locally(self) -> bool:
        """Whether a transaction is a sub-millisecond local one (SQLite), fit to run on an
        event loop; else (PostgreSQL) each waits on the network."""
        return self.db.is_sqlite

    def keeps_headroom(self) -> bool:
        """Whether nodes keep a headroom (app.core.headroom): a configured amount."""
        return not self.headroom.amount.is_zero()
