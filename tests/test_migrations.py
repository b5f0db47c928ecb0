"""The schema exists only through Alembic; revisions go down and up again, and the
SQLAlchemy models match what the migrations build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from app.core.records import HeldDevice, Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.db import migrate
from app.db.engine import Database, create_db_engine
from app.ledger.service import Ledger
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
    assert {"nodes", "holdings", "events", "slurm_job_hints", "slurm_node_hints"} <= tables
    assert migrate.current(engine) == "0007"
    engine.dispose()


def test_device_objects_go_down_to_two_columns_and_up_again(database: Database) -> None:
    """0006: each holding's devices, one object each, split back into indices and their
    UUIDs by the downgrade, and joined again by the upgrade, nothing lost."""
    ledger = Ledger(database)
    ledger.upsert_node("n1", NodeSpec(Resources(16000, 2**36, 4)))
    named = (HeldDevice(0, "GPU-a"), HeldDevice(2))
    for holder, devices in (("both", named), ("unknown", (HeldDevice(1),)), ("counted", ())):
        gpus = len(devices) or 1
        ledger.admit(
            "n1", Holder(HolderKind.MANUAL, holder), Resources(1000, 0, gpus), devices=devices
        )
    before = {h.holder.id: h for h in ledger.get_node("n1").holdings}
    assert before["both"].devices == named

    migrate.downgrade(database.engine, "0005")
    select = "SELECT holder_id, devices, device_uuids FROM holdings ORDER BY holder_id"
    with database.engine.connect() as connection:
        rows = {r[0]: (_json(r[1]), _json(r[2])) for r in connection.execute(text(select))}
    assert rows == {
        "both": ([0, 2], ["GPU-a", ""]),
        "counted": ([], []),
        "unknown": ([1], []),
    }

    migrate.upgrade(database.engine)
    assert {h.holder.id: h for h in ledger.get_node("n1").holdings} == before


def _json(value: object) -> object:
    # A JSON column read by plain SQL: text on SQLite, decoded by psycopg on PostgreSQL.
    return json.loads(value) if isinstance(value, str) else value


def test_cli_db_upgrade_and_env_settings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    result = subprocess.run(
        [sys.executable, "-m", "app", "db", "upgrade", "--database-url", url],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "0007"
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
