"""Locks shared by every replica of the service through its database: what keeps several
replicas on one PostgreSQL from undoing each other's work in Slurm.

Contract:
- ``node_lock(node)``: at most one holder per node across all replicas. On PostgreSQL a
  session-level advisory lock on a connection of the holder's own, released when the
  block ends, and with the connection if the holder's process dies: a killed replica
  never keeps a node locked. The holder runs its transactions on that connection, after
  the lock is taken (READ COMMITTED: every statement sees what was committed before
  it), so whatever it computes from the ledger includes every change committed before
  it took the lock; several transactions, so that it can commit a change (the headroom's
  lowered grant, app.core.headroom) before it tells Slurm. The Slurm pusher does
  read-ledger -> push -> read-back under it, so the last push to a node always carries
  every hold committed before it started, and no push computed earlier can land after
  it.
- ``Leadership(name)``: at most one replica holds it: a session-level advisory lock on a
  connection of its own, lost with that connection (replica killed, database restarted),
  which the holder notices at its next ``check()``. The Slurm sync runs only while held.
SQLite keeps one replica per database file (docs/deploy.md): both are local to the process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from weakref import WeakValueDictionary

from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from app.db.engine import Database

log = logging.getLogger(__name__)

# One 64-bit advisory key per name: PostgreSQL's own string hash, so every replica agrees.
_KEY = "hashtextextended(:name, 0)"


class _LocalLocks:
    """Per-name threading locks, kept only while someone uses them."""

    def __init__(self) -> None:
        self._locks: WeakValueDictionary[str, threading.Lock] = WeakValueDictionary()
        self._guard = threading.Lock()

    def get(self, name: str) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = threading.Lock()
                self._locks[name] = lock
            return lock


_local = _LocalLocks()


@contextmanager
def node_lock(db: Database, node: str) -> Iterator[Connection]:
    """Hold ``node`` against every replica; yields the connection to run transactions on
    (``Database.transaction``), outside any transaction."""
    name = f"nodeledger.node:{node}"
    if db.is_sqlite:
        lock = _local.get(f"{db.engine.url}:{name}")
        with lock, db.engine.connect() as connection:
            yield connection
        return
    connection = db.engine.connect()
    locked = False
    try:
        connection.execute(text(f"SELECT pg_advisory_lock({_KEY})"), {"name": name})
        connection.commit()  # the session lock stays
        locked = True
        yield connection
    finally:
        try:
            if connection.in_transaction():
                connection.rollback()
            if locked:
                connection.execute(text(f"SELECT pg_advisory_unlock({_KEY})"), {"name": name})
                connection.commit()
        except SQLAlchemyError:
            connection.invalidate()  # ending the session drops its advisory lock
        connection.close()


class Leadership:
    """A role only one replica plays at a time (see the module docstring)."""

    def __init__(self, db: Database, name: str) -> None:
        self.db = db
        self.name = f"nodeledger.leader:{name}"
        self._connection: Connection | None = None

    def check(self) -> bool:
        """Whether this replica holds the role now; tries to take it when it does not."""
        if self.db.is_sqlite:
            return True
        try:
            if self._connection is not None:
                self._connection.exec_driver_sql("SELECT 1")  # still ours?
                self._connection.commit()
                return True
            connection = self.db.engine.connect()
            taken = connection.execute(
                text(f"SELECT pg_try_advisory_lock({_KEY})"), {"name": self.name}
            ).scalar()
            connection.commit()  # end the implicit transaction; the session lock stays
            if not taken:
                connection.close()
                return False
            log.info("this replica now holds %s", self.name)
            self._connection = connection
            return True
        except SQLAlchemyError as exc:
            if self._connection is not None:
                log.warning("lost %s: %s", self.name, exc)
            self.release()
            return False

    def release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            # Unlocked before the session ends: the server drops a closed session's locks
            # only once its backend notices, and another replica may ask at once.
            connection.execute(text(f"SELECT pg_advisory_unlock({_KEY})"), {"name": self.name})
            connection.commit()
        except SQLAlchemyError:
            pass  # the connection is gone, and the lock with it
        try:
            connection.invalidate()  # ending the session drops its advisory lock too
            connection.close()
        except SQLAlchemyError:
            pass
