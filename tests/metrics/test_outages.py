"""A dependency's outage in the logs and metrics: two lines however many calls fail, the
failures themselves at DEBUG; slurmrestd's through the real client and a closed port."""

from __future__ import annotations

import logging
import threading

import pytest
from prometheus_client import CollectorRegistry

from app.kube.client import KubeError
from app.metrics.registry import Metrics
from app.outages import SETTLE, Dependency, dependency_away, log_failure
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


def test_a_failure_just_after_an_outage_ends_belongs_to_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call begun while the database was away can fail just after another found it back
    (PostgreSQL, under load): no second outage of 0.0 s; one that goes on failing past
    SETTLE is a new outage."""
    caplog.set_level(logging.DEBUG)
    clock, metrics = Clock(), Metrics(CollectorRegistry())
    database = Dependency("database", metrics=metrics, monotonic=clock)
    database.failed("connection refused")
    clock.now += 3.0
    database.answered()
    clock.now += 0.001
    database.failed("the database system is not yet accepting connections")
    assert database.status() is None
    assert value(metrics, "nodeledger_dependency_up", "database") == 1
    clock.now += SETTLE
    database.failed("connection refused again")
    assert database.status() == "unavailable for 0.0 s: connection refused again"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "database unavailable: connection refused",
        "database available again after 3.0 s (1 failed calls meanwhile)",
        "database unavailable: connection refused again",
    ]
    assert value(metrics, "nodeledger_dependency_outages_total", "database") == 2


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


@pytest.mark.parametrize(
    ("error", "away"),
    [
        pytest.param(KubeError("connection refused"), True, id="api-server-unreachable"),
        pytest.param(KubeError("etcd timed out", status=503), True, id="api-server-5xx"),
        pytest.param(KubeError("forbidden", status=403), False, id="forbidden-is-a-bug"),
        pytest.param(KubeError("not found", status=404), False, id="not-found-is-a-bug"),
    ],
)
def test_the_kubernetes_api_away_is_an_outage_not_a_bug(error: KubeError, away: bool) -> None:
    """The status mirror retries every 0.2 s: an API server outage must not write a
    traceback each time."""
    assert dependency_away(error) is away


class SlowGauge(Metrics):
    """Metrics whose first "down" write waits (up to 0.5 s) for an "up" write to overtake it."""

    def __init__(self) -> None:
        super().__init__(CollectorRegistry())
        self.writing_down, self.wrote_up = threading.Event(), threading.Event()
        self.writes: list[bool] = []

    def dependency(self, name: str, *, up: bool, outage: bool) -> None:
        if not up and not self.writing_down.is_set():
            self.writing_down.set()
            self.wrote_up.wait(0.5)
        elif up and self.writing_down.is_set():
            self.wrote_up.set()
        self.writes.append(up)
        super().dependency(name, up=up, outage=outage)


def test_an_answer_racing_a_failure_leaves_the_gauge_as_the_state_is() -> None:
    """A dependency fails in one thread and answers in another while the failure is being
    recorded: the gauge ends as the state does (up), never at 0 while it answers."""
    metrics = SlowGauge()
    database = Dependency("database", metrics=metrics)
    failing = threading.Thread(target=database.failed, args=("refused",))
    failing.start()
    assert metrics.writing_down.wait(5)
    answering = threading.Thread(target=database.answered)
    answering.start()
    failing.join()
    answering.join()
    assert database.status() is None
    assert metrics.writes[-1] is True
    assert value(metrics, "nodeledger_dependency_up", "database") == 1


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
