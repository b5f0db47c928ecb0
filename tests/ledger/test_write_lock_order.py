"""SQLite: a writer waiting for a pooled connection must not hold the process's write lock,
which a node lock's holder (app.db.locks) needs for its own transaction on the connection it
already has. Inverted, a full pool of node-lock holders (pushes to 15+ nodes at once, the
default pool) and one writer deadlock until the pool's timeout."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from app.db.engine import Database, _configure_sqlite
from app.db.locks import node_lock
from tests.support.realenv import wait_until

POOL_TIMEOUT = 60  # seconds: what the holder would wait, were the locks taken in the wrong order


def one_connection_database(path: Path) -> Database:
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"check_same_thread": False},
        pool_size=1,
        max_overflow=0,
        pool_timeout=POOL_TIMEOUT,
    )
    _configure_sqlite(engine)
    db = Database(engine)
    with db.write_statements() as connection:
        connection.execute(text("CREATE TABLE t (x INTEGER)"))
    return db


def waiting_for_a_connection(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked in the pool's queue (SQLAlchemy's util/queue.py): the
    state the test needs both writers in, seen rather than hoped for after a sleep."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "get" and code.co_filename.endswith("util/queue.py"):
            return True
        frame = frame.f_back
    return False


def test_a_writer_waiting_for_a_connection_leaves_the_write_lock_to_a_node_lock_holder(
    tmp_path: Path,
) -> None:
    db = one_connection_database(tmp_path / "ledger.db")
    outcomes: dict[str, str] = {}

    def writer(name: str, **kwargs: bool) -> None:
        try:
            if kwargs.get("orm"):
                with db.write() as session:
                    session.execute(text("INSERT INTO t VALUES (2)"))
            else:
                with db.write_statements() as connection:
                    connection.execute(text("INSERT INTO t VALUES (1)"))
            outcomes[name] = "ok"
        except Exception as exc:  # the pool's timeout, were the locks taken in the wrong order
            outcomes[name] = type(exc).__name__

    with node_lock(db, "n1") as held:  # the pool's one connection
        writers = [
            threading.Thread(target=writer, args=("statements",)),
            threading.Thread(target=writer, args=("orm",), kwargs={"orm": True}),
        ]
        for thread in writers:
            thread.start()
        wait_until(lambda: all(waiting_for_a_connection(t) for t in writers), 30,
                   what="both writers waiting for the connection")  # fmt: skip
        started = time.monotonic()
        with db.transaction(held, write=True) as connection:
            connection.execute(text("INSERT INTO t VALUES (0)"))
        waited = time.monotonic() - started
    for thread in writers:
        thread.join(10)
    # Inverted, the holder waits out the writers' pool timeout; anything well below it is
    # the right order, however busy the machine.
    assert waited < POOL_TIMEOUT / 2, f"the node lock's holder waited {waited:.1f} s"
    assert outcomes == {"statements": "ok", "orm": "ok"}
    with db.read_statements() as connection:
        assert sorted(connection.execute(text("SELECT x FROM t")).scalars()) == [0, 1, 2]
