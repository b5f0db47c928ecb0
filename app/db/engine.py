"""Engines and transactions for SQLite and PostgreSQL.

Concurrency contract: every write transaction that changes a node's holdings first takes
that node's row lock (``SELECT ... FOR UPDATE`` on PostgreSQL). SQLite has no row locks,
so write transactions start with ``BEGIN IMMEDIATE``, which takes the database write lock
up front: writers serialize, readers (WAL) never block. Inside one process SQLite writers
also queue on a lock of our own first, because SQLite's busy handler waits by sleeping
(up to 100 ms a try) where a queue hands over at once. That lock is taken only with a
connection in hand: a node lock's holder (app.db.locks) takes it on the connection it
holds, so a writer that held it while waiting for a pooled connection would wait on that
holder, and the holder on it, whenever node locks fill the pool (pushes to 15 nodes at
once). Either way two admissions racing
for the last CPU see each other's holdings, in one process or in several.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

_SQLITE_BUSY_TIMEOUT_MS = 30_000
# Set in a pooled SQLite connection's info while its transactions are writes.
_BEGIN_IMMEDIATE = "nodeledger.begin_immediate"


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain postgresql:// URLs (the driver we ship)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("", "psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # The dialect's do_begin below issues BEGIN instead of pysqlite.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    # BEGIN from the dialect, not from a "begin" connection event (SQLAlchemy's recipe):
    # any connection event makes SQLAlchemy dispatch events around every statement,
    # a fifth of an admission's ledger time.
    def _begin(dbapi_connection: Any) -> None:
        immediate = dbapi_connection.info.get(_BEGIN_IMMEDIATE, False)
        dbapi_connection.execute("BEGIN IMMEDIATE" if immediate else "BEGIN DEFERRED")

    engine.dialect.do_begin = _begin  # type: ignore[method-assign]


@contextmanager
def _immediate(connection: Connection) -> Iterator[None]:
    """The transactions begun on ``connection`` meanwhile take SQLite's write lock at BEGIN."""
    info = connection.connection.info
    info[_BEGIN_IMMEDIATE] = True
    try:
        yield
    finally:
        info.pop(_BEGIN_IMMEDIATE, None)


def is_outage(exc: BaseException) -> bool:
    """A lost or refused connection (the database restarted, failing over): retryable, and
    the pool reconnects by itself. Any other database error is a bug."""
    return isinstance(exc, DBAPIError) and (
        isinstance(exc, OperationalError) or exc.connection_invalidated
    )


@dataclass(frozen=True, slots=True)
class Liveness:
    """How soon either end of a PostgreSQL connection gives up on a silent peer.

    A replica whose host dies (power, kernel panic, partition) sends no FIN or RST: without
    probes the server keeps its session, and with it the session's advisory locks (the
    Slurm sync's leadership, node locks: app.db.locks), for as long as the kernel keeps the
    connection, hours. TCP keepalives on the server's end of the connection end such a
    session after ``idle + interval * count`` seconds of silence, which releases its locks
    to another replica; the same on our end (libpq's) makes a replica cut off from the
    server fail its next statement instead of hanging on it, so it stops acting as leader.
    ``user_timeout`` bounds how long sent data may stay unacknowledged (keepalives only
    probe an idle connection). A stopped but living process is not silent (its kernel
    answers the probes): that is a hang, not a death, and keeps its locks.
    """

    idle_seconds: int = 5
    interval_seconds: int = 2
    count: int = 3
    user_timeout_seconds: int = 10

    def connect_args(self, options: str | None) -> dict[str, Any]:
        """libpq parameters: our end's probes, and the server's end's (per session GUCs,
        appended to the URL's own ``options``)."""
        server = (
            f"-c tcp_keepalives_idle={self.idle_seconds}"
            f" -c tcp_keepalives_interval={self.interval_seconds}"
            f" -c tcp_keepalives_count={self.count}"
            f" -c tcp_user_timeout={self.user_timeout_seconds * 1000}"
        )
        return {
            "keepalives": 1,
            "keepalives_idle": self.idle_seconds,
            "keepalives_interval": self.interval_seconds,
            "keepalives_count": self.count,
            "tcp_user_timeout": self.user_timeout_seconds * 1000,
            "options": f"{options} {server}" if options else server,
        }


def create_db_engine(url: str, *, pool_size: int = 10, liveness: Liveness | None = None) -> Engine:
    """``liveness``: PostgreSQL's keepalives (``Liveness``' defaults when not given)."""
    url = normalize_url(url)
    if is_sqlite(url):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        _configure_sqlite(engine)
        return engine
    options = make_url(url).query.get("options")
    connect_args = (liveness or Liveness()).connect_args(
        options if isinstance(options, str) else None
    )
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args=connect_args,
    )


class Database:
    """Hands out read and write transactions; the only place that knows the backend."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._write_lock = threading.Lock() if self.is_sqlite else None
        self._committed: list[Callable[[], None]] = []

    @classmethod
    def from_url(
        cls, url: str, *, pool_size: int = 10, liveness: Liveness | None = None
    ) -> Database:
        return cls(create_db_engine(url, pool_size=pool_size, liveness=liveness))

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each write transaction of this process commits (it must
        be quick: it runs on the writer's thread)."""
        self._committed.append(listener)

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction: committed on success, rolled back on any exception."""
        # The connection before the lock (module docstring); the session runs on it.
        with (
            self.engine.connect() as connection,
            self._writing(connection),
            self._sessions(bind=connection) as session,
            session.begin(),
        ):
            yield session
        self._notify()

    @contextmanager
    def write_statements(self) -> Iterator[Connection]:
        """The same write transaction on a bare Core connection, for the hot paths (admit,
        release): their prebuilt statements need no unit of work, and skipping the
        Session saves a fifth of their cost."""
        with self.engine.connect() as connection, self._writing(connection), connection.begin():
            yield connection
        self._notify()

    @contextmanager
    def transaction(self, connection: Connection, *, write: bool) -> Iterator[Connection]:
        """A transaction on a connection the caller holds (a node lock's, app.db.locks):
        committed on success; a write one as ``write_statements``'."""
        with self._writing(connection) if write else nullcontext(), connection.begin():
            yield connection
        if write:
            self._notify()

    def _notify(self) -> None:
        for listener in self._committed:
            listener()

    @contextmanager
    def _writing(self, connection: Connection) -> Iterator[None]:
        """Write transactions on ``connection`` meanwhile: on SQLite this process's writers
        queue on one lock, and each transaction takes SQLite's at BEGIN (module docstring)."""
        if self._write_lock is None:
            yield
            return
        with self._write_lock, _immediate(connection):
            yield

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    @contextmanager
    def read_statements(self) -> Iterator[Connection]:
        """A read on a bare Core connection, for reads made on every call of a hot path."""
        with self.engine.connect() as connection:
            yield connection

    def watch(self, failed: Callable[[str], None], answered: Callable[[], None]) -> None:
        """Report the database's availability (app.outages): ``failed`` when a connection
        is lost or cannot be made, ``answered`` when a new one is made."""

        @event.listens_for(self.engine, "handle_error")
        def _error(context: ExceptionContext) -> None:
            # A failed pre-ping is an old pooled connection replaced at once, not an outage.
            if context.is_pre_ping:
                return
            if context.is_disconnect or context.connection is None:  # lost, or connecting
                failed(str(context.original_exception))

        @event.listens_for(self.engine.pool, "connect")
        def _connected(_dbapi_connection: Any, _record: Any) -> None:
            answered()

    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")

    def dispose(self) -> None:
        self.engine.dispose()
