"""Bring the schema up to date with Alembic; the only way tables are created."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

import app

# Any constant works; it only has to be the same for every replica of the service.
_PG_MIGRATION_LOCK = 0x6E6F64656C  # "nodel"


def migrations_dir() -> Path:
    """Top-level migrations/ in a source tree, app/_migrations in an installed wheel."""
    package = Path(app.__file__).resolve().parent
    for candidate in (package.parent / "migrations", package / "_migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError("Alembic migrations not found next to the app package")


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade under a PostgreSQL advisory lock so replicas starting together do not race;
    SQLite serializes the DDL by its own write lock."""
    config = alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK}
            )
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def current(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
