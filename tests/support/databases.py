"""Real databases for tests: a fresh migrated SQLite file or PostgreSQL database per test."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.db import migrate
from app.db.engine import create_db_engine
from tests.support.realenv import REPO

PG_SCRIPT = Path(REPO) / "testenv" / "postgres" / "pg.sh"


def postgres_server_url() -> str:
    """NODELEDGER_TEST_POSTGRES_URL when given, else the repo's throwaway cluster."""
    given = os.environ.get("NODELEDGER_TEST_POSTGRES_URL")
    if given:
        return given
    result = subprocess.run(
        ["bash", str(PG_SCRIPT), "up"], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{PG_SCRIPT} up failed: {result.stderr.strip()[-2000:]}")
    return result.stdout.strip().splitlines()[-1]


def migrated(url: str) -> str:
    engine = create_db_engine(url)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    return url


def sqlite_database(directory: Path) -> str:
    return migrated(f"sqlite:///{directory / 'ledger.db'}")


@contextmanager
def postgres_database(server_url: str) -> Iterator[str]:
    """A new database on the server, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    # pre_ping: the server may have been restarted meanwhile (tests/chaos).
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        yield migrated(url)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
