"""A dependency's outage in the logs and metrics: two lines however many calls fail, the
failures themselves at DEBUG; slurmrestd's through the real client and a closed port."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from app.metrics.registry import Metrics
from app.outages import Dependency, log_failure
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmUnavailable
from app.slurm.tokens import StaticToken
from tests.support.net import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def value(metrics: Metrics, name: str, dependency: str) -> float | None:
    assert metrics.registry is not None
    return metrics.registry.get_sample_value(name, {"dependency": dependency})


def test_an_outage_is_two_lines_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    clock, metrics = Clock(), Metrics(CollectorRegistry())
    database = Dependency("database", metrics=metrics, monotonic=clock)
    assert value(metrics, "nodeledger_dependency_up", "database") == 1
    database.answered()
    for i in range(500):
        database.failed(f"connection refused {i}\n\tIs the server running?")
    clock.now += 4.25
    assert database.status() == (
        "unavailable for 4.2 s: connection refused 0 Is the server running?"
    )
    assert value(metrics, "nodeledger_dependency_up", "database") == 0
    database.answered()
    database.answered()
    assert database.status() is None
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "app.outages"]
    assert lines == [
        ("WARNING", "database unavailable: connection refused 0 Is the server running?"),
        ("WARNING", "database available again after 4.2 s (500 failed calls meanwhile)"),
    ]
    assert value(metrics, "nodeledger_dependency_up", "database") == 1
    assert value(metrics, "nodeledger_dependency_outages_total", "database") == 1


def test_a_background_failure_is_a_traceback_unless_a_dependency_is_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    log = logging.getLogger("tests.outages")
    log_failure(log, "sync step", SlurmUnavailable("slurmrestd GET nodes timed out"))
    log_failure(log, "sync step", KeyError("a bug"))
    (away, bug) = caplog.records
    assert (away.levelname, away.exc_info) == ("DEBUG", None)
    assert bug.levelname == "ERROR"
    assert bug.exc_info is not None


def test_slurmrestd_away_is_logged_once_by_the_real_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    metrics = Metrics(CollectorRegistry())
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = SlurmClient(url, StaticToken("t"), retries=0, api_version="v0.0.42", metrics=metrics)
    for _ in range(5):
        with pytest.raises(SlurmUnavailable):
            client.get_nodes()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("slurmrestd unavailable: slurmrestd GET /slurm/v0.0.42/nodes")
    assert value(metrics, "nodeledger_dependency_up", "slurmrestd") == 0
    client.close()
