"""Fixtures shared by every test: real databases and the application.

Under pytest-xdist each worker has real components of its own (tests/support/workers.py);
the tests marked `deploy` (real kubelets, one cluster with nodes per machine) all run on one.

`database_url` runs a test once on SQLite and once on PostgreSQL (the repo's throwaway
cluster, or NODELEDGER_TEST_POSTGRES_URL). Real components missing: skip locally, fail in CI.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.db.engine import Database
from app.ledger.service import Ledger
from app.main import create_app
from app.settings import Settings
from tests.support import workers
from tests.support.databases import postgres_database, postgres_server_url, sqlite_database
from tests.support.realenv import unavailable

pytest_plugins = [
    m
    for m in ("tests.support.slurm_fixtures", "tests.support.kube_fixtures")
    if importlib.util.find_spec(m) is not None
] + ["tests.support.ordering", "tests.support.timeline"]


def pytest_configure(config: pytest.Config) -> None:
    """Each worker, and a run without workers, on its own components before any test module
    reads the run directory, cache or ports; not the controller of workers (they would
    inherit its choice)."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        workers.isolate()


@pytest.fixture(scope="session")
def postgres_server() -> str:
    try:
        return postgres_server_url()
    except Exception as exc:  # any failure to start means unavailable
        unavailable("PostgreSQL", str(exc))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return sqlite_database(tmp_path)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    with postgres_database(postgres_server) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    db = Database.from_url(database_url, pool_size=20)
    yield db
    db.dispose()


@pytest.fixture
def ledger(database: Database) -> Ledger:
    return Ledger(database)


@pytest.fixture
def api(database_url: str) -> Iterator[TestClient]:
    """The application in-process, on a real database, lifespan included."""
    app = create_app(Settings(database_url=database_url, migrate_on_start=False))
    with TestClient(app) as client:
        yield client


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The deploy tests share the machine's one cluster with real nodes: one worker runs
    them all (`--dist loadgroup`; the older Kubernetes minors' groups: kube_fixtures)."""
    for item in items:
        if item.get_closest_marker("deploy") is not None:
            item.add_marker(pytest.mark.xdist_group("deploy"))
