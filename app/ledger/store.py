"""Transactions on the ledger's database, and the one place that pairs each kind of
transaction with its SQL path.

Two paths, for cost: the hot path (what runs on every admission, release, confirmation
and follower poll, and bulk recording) runs prebuilt Core statements (LedgerStatements) on
a bare connection, a fraction of the ORM's cost per call; everything else uses an ORM
Session (LedgerRepository), simpler to write. Queries and commands open transactions only
here: ``read``/``write`` for the ORM path, ``read_hot``/``write_hot`` for the hot one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from sqlalchemy import Connection

from app.core.records import NodeView
from app.core.resources import Resources
from app.db.engine import Database
from app.db.locks import node_lock
from app.ledger import events
from app.ledger.clock import Clock, utcnow
from app.ledger.repository import LedgerRepository
from app.ledger.statements import LedgerStatements


class Store:
    def __init__(self, db: Database, clock: Clock = utcnow) -> None:
        self.db = db
        self.clock = clock  # the time of the events ExclusiveNode records

    @contextmanager
    def read(self) -> Iterator[LedgerRepository]:
        with self.db.read() as session:
            yield LedgerRepository(session)

    @contextmanager
    def write(self) -> Iterator[LedgerRepository]:
        with self.db.write() as session:
            yield LedgerRepository(session)

    @contextmanager
    def read_hot(self) -> Iterator[LedgerStatements]:
        with self.db.read_statements() as connection:
            yield LedgerStatements(connection)

    @contextmanager
    def write_hot(self) -> Iterator[LedgerStatements]:
        with self.db.write_statements() as connection:
            yield LedgerStatements(connection)

    @contextmanager
    def exclusive(self, name: str) -> Iterator[ExclusiveNode]:
        """The node held against every replica until the block ends (the contract is
        app.db.locks'), and the transactions its holder runs meanwhile."""
        with node_lock(self.db, name) as connection:
            yield ExclusiveNode(self.db, connection, name, self.clock)


class ExclusiveNode:
    """A node this caller holds against every replica (the Slurm pusher's), read and
    written on the lock's own connection: a holder never waits for a second connection.
    Every change of the grant it commits comes with a HEADROOM event naming the node, in
    the same transaction: the read model (app.ledger.snapshot) reads a node again only on
    such an event, and skips SLURM_PUSHED."""

    def __init__(
        self, db: Database, connection: Connection, name: str, clock: Clock = utcnow
    ) -> None:
        self.db = db
        self.connection = connection
        self.name = name
        self.clock = clock

    def view(self, *, grant_at_most: Callable[[NodeView], Resources] | None = None) -> NodeView:
        """The node as it is now. With ``grant_at_most``, its headroom's grant is first
        lowered to at most what that returns for the view, and committed before this
        returns (app.core.headroom: before Slurm is told less). Only the holder of this
        lock raises a grant, so a grant already within the limit needs no row lock."""
        view = self._read(lock=False)
        if grant_at_most is None or view.headroom.granted.fits_within(grant_at_most(view)):
            return view
        # Lowering: under the row lock, so that every admission either is in the view the
        # limit is computed from or sees the lowered grant.
        return self._read(lock=True, grant_at_most=grant_at_most)

    def _read(
        self, *, lock: bool, grant_at_most: Callable[[NodeView], Resources] | None = None
    ) -> NodeView:
        with self.db.transaction(self.connection, write=lock) as connection:
            repo = LedgerStatements(connection)
            node_id, view = repo.node_view(self.name, lock=lock)
            if grant_at_most is None:
                return view
            granted = view.headroom.granted.at_most(grant_at_most(view))
            if granted == view.headroom.granted:
                return view
            headroom = replace(view.headroom, granted=granted)
            repo.set_headroom(node_id, headroom)
            before = view.headroom.granted
            repo.insert_event(events.headroom_granted(self.clock(), self.name, before, granted))
            return replace(view, headroom=headroom)

    def finish(self, granted: Resources | None, event: events.EventDraft | None) -> None:
        """Record what a push found: the grant (None: unchanged) and its event."""
        if event is None and granted is None:
            return
        with self.db.transaction(self.connection, write=True) as connection:
            repo = LedgerStatements(connection)
            node = repo.lock_node_state(self.name)
            current = node.headroom
            if event is not None:
                repo.insert_event(event)
            if granted is not None and granted != current.granted:
                repo.set_headroom(node.id, replace(current, granted=granted))
                now = self.clock() if event is None else event.at
                repo.insert_event(events.headroom_granted(now, self.name, current.granted, granted))
