"""Whether a dependency (the database, slurmrestd, the Kubernetes API) answers, as this
process last saw it.

An outage is written as two log lines, whatever the number of requests that hit it: one
WARNING when the dependency stops answering (the first failure's reason), one WARNING when
it answers again, with how long it was away and how many calls failed meanwhile (both at
WARNING, so a service logging at WARNING never shows an outage that seems to last). Every
failed call between them is the callers' to log at DEBUG (``Dependency.down``).
``nodeledger_dependency_up`` and ``nodeledger_dependency_outages_total`` count the same,
and /readyz names an ongoing outage and its length.

Callers report what they saw: ``failed(reason)`` on a failure that says the dependency is
away (refused, timed out, lost connection, 5xx), ``answered()`` on any answer from it. A
failure within ``SETTLE`` seconds of the dependency answering again is taken for a call
begun while it was still away (measured: PostgreSQL refused a connection it had taken while
still recovering, 1 ms after another succeeded), logged at DEBUG, not a new outage; one
that really starts then goes on failing past it and is logged then.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from app.core.errors import NodeledgerError
from app.db.engine import is_outage
from app.metrics.registry import NO_METRICS, Metrics

log = logging.getLogger(__name__)
MAX_REASON = 300  # characters of the first failure's reason in a log line or /readyz
SETTLE = 1.0  # seconds after an outage ends in which a failure still belongs to it


class Dependency:
    def __init__(
        self,
        name: str,
        *,
        metrics: Metrics = NO_METRICS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.metrics = metrics
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._since: float | None = None  # start of the ongoing outage
        self._settled = -math.inf  # until when a failure still belongs to the last outage
        self._reason = ""
        self._failures = 0
        metrics.dependency(name, up=True, outage=False)

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, reason: str) -> None:
        with self._lock:
            self._failures += 1
            if self._since is not None:
                return
            now = self.monotonic()
            if now < self._settled:
                self._failures = 0
                late = True
            else:
                late = False
                self._since = now
                self._reason = _short(reason)
                # Under the lock: an answered() in between must not leave the gauge at 0.
                self.metrics.dependency(self.name, up=False, outage=True)
        if late:
            log.debug("%s: a call begun before it came back failed: %s", self.name, reason)
            return
        log.warning("%s unavailable: %s", self.name, self._reason)

    def answered(self) -> None:
        if self._since is None:  # unlocked: the common case costs one attribute read
            return
        with self._lock:
            if self._since is None:
                return
            now = self.monotonic()
            took, failures = now - self._since, self._failures
            self._since, self._failures, self._settled = None, 0, now + SETTLE
            self.metrics.dependency(self.name, up=True, outage=False)
        log.warning(
            "%s available again after %.1f s (%d failed calls meanwhile)",
            self.name,
            took,
            failures,
        )

    def status(self) -> str | None:
        """None when answering, else what /readyz says about the outage."""
        with self._lock:
            if self._since is None:
                return None
            return f"unavailable for {self.monotonic() - self._since:.1f} s: {self._reason}"


def _short(reason: str) -> str:
    # Drivers write several lines (psycopg: a hint line, SQLAlchemy's background link).
    first = " ".join(reason.split())
    first = first.split(" (Background on this error")[0]
    return first if len(first) <= MAX_REASON else first[:MAX_REASON] + "..."


def dependency_away(exc: BaseException) -> bool:
    """The failure is a dependency not answering (its outage is logged by its Dependency),
    not a bug: the database lost or refused, slurmrestd or the Kubernetes API unreachable or
    failing (an error that says it is ``unavailable``)."""
    return is_outage(exc) or (isinstance(exc, NodeledgerError) and exc.unavailable)


def log_failure(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """A background step that failed: a traceback for a bug; for a dependency that is away,
    one DEBUG line (an outage would otherwise write a traceback every round)."""
    if dependency_away(exc):
        logger.debug("%s: %s", what, exc)
    else:
        logger.error("%s", what, exc_info=exc)
