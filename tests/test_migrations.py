"""The schema exists only through Alembic; revisions go down and up again, and the
SQLAlchemy models match what the migrations build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from app.db import migrate
from app.db.engine import create_db_engine
from app.ledger.tables import Base
from tests.support.realenv import REPO


def test_models_match_migrations(database_url: str) -> None:
    engine = create_db_engine(database_url)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []


def test_downgrade_and_upgrade_again(database_url: str) -> None:
    engine = create_db_engine(database_url)
    migrate.downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    migrate.upgrade(engine)
    tables = set(inspect(engine).get_table_names())
    assert {"nodes", "holdings", "events", "slurm_job_hints"} <= tables
    assert migrate.current(engine) == "0005"
    engine.dispose()


def test_cli_db_upgrade_and_env_settings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    result = subprocess.run(
        [sys.executable, "-m", "app", "db", "upgrade", "--database-url", url],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "0005"
    env_url = f"sqlite:///{tmp_path / 'env.db'}"
    result = subprocess.run(
        [sys.executable, "-m", "app", "db", "current"],
        cwd=REPO,
        env={"NODELEDGER_DATABASE_URL": env_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "empty"
    help_text = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for flag in ("--database-url", "--host", "--port", "--log-level"):
        assert flag in help_text
