"""Transactions on the ledger's database, and the one place that pairs each kind of
transaction with its SQL path.

Two paths, for cost: the hot path (what runs on every admission, release, confirmation
and follower poll, and bulk recording) runs prebuilt Core statements (LedgerStatements) on
a bare connection, a fraction of the ORM's cost per call; everything else uses an ORM
Session (LedgerRepository), simpler to write. Queries and commands open transactions only
here: ``read``/``write`` for the ORM path, ``read_hot``/``write_hot`` for the hot one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session

from app.core.ledger_errors import NodeNotFound
from app.core.records import NodeView
from app.db.engine import Database
from app.db.locks import node_lock
from app.ledger.repository import LedgerRepository, LedgerStatements


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db

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
    def exclusive(self, name: str) -> Iterator[NodeView]:
        """The node as it is once this caller holds it against every replica, which it
        does until the block ends (the contract is app.db.locks')."""
        with node_lock(self.db, name) as connection:
            with Session(bind=connection) as session:
                repo = LedgerRepository(session)
                row = repo.find_node(name)
                if row is None:
                    raise NodeNotFound(name)
                view = repo.view(row)
            yield view
