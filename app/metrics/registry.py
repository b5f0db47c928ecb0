"""The service's metrics. Their names, types and labels are a contract: alerts and a
dashboard are written against them (docs/operations.md#metrics).

One ``Metrics`` per application, on a CollectorRegistry of its own: tests build many apps
in one process, where the global registry would refuse the second. Components take a
``Metrics`` as an optional keyword and default to ``NO_METRICS``, which counts into
metrics registered nowhere. Every label value here comes from a bounded set: no node
name, holder or free text becomes a label (the per-node series are the ledger
collector's, app.metrics.nodes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Literal, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from app import __version__
from app.core.errors import DependencyError, NodeledgerError
from app.core.ledger_errors import AdmissionRejected, LedgerError

AdmissionPath = Literal["rest", "extender", "genericnode", "resize"]
ReleasePath = Literal["rest", "extender", "kubernetes"]
AdmissionResult = Literal["admitted", "rejected_ledger", "rejected_slurm", "failed_closed"]
Phase = Literal["ledger", "slurm"]
PushReason = Literal["admission", "release", "drift", "retry", "headroom", "other"]
SlurmOutcome = Literal["ok", "error", "unavailable", "auth"]
LeaderRole = Literal["kube-controllers", "slurm-sync"]
ExtenderVerb = Literal["filter", "prioritize", "bind"]

# 0.5 ms (a local SQLite admission) .. 5 s (the default slurmrestd timeout).
ADMISSION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
SLURM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SYNC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

# No `<name>_created` series next to every counter and histogram: they double the series
# and no alert or panel uses them. (A process-wide switch of prometheus-client.)
disable_created_metrics()  # type: ignore[no-untyped-call]


def admission_result(exc: BaseException, phase: Phase | None) -> AdmissionResult | None:
    """How an admission that raised ``exc`` in ``phase`` counts; None when the failure says
    nothing about the admission (the database down: answered 503, not counted)."""
    if phase == "slurm":
        # Slurm is the only dependency the phase calls: an error from it is "could not confirm".
        if isinstance(exc, AdmissionRejected) and not isinstance(exc.__cause__, DependencyError):
            return "rejected_slurm"  # Slurm said no: a job overlaps, or the Kubernetes cap
        if isinstance(exc, LedgerError) and not isinstance(exc, AdmissionRejected):
            return "rejected_ledger"  # e.g. the node was deleted meanwhile
        return "failed_closed"  # Slurm could not confirm: unreachable, timeout, token
    return "rejected_ledger" if isinstance(exc, LedgerError) else None


# The outcomes other than "ok" and "error", by the code of the error the request raised
# (app.slurm.errors: this package is below app.slurm and names none of its classes).
SLURM_OUTCOMES: dict[str, SlurmOutcome] = {
    "slurm_auth_refused": "auth",
    "slurm_unavailable": "unavailable",
}


def slurm_outcome(exc: BaseException) -> SlurmOutcome:
    code = exc.code if isinstance(exc, NodeledgerError) else ""
    return SLURM_OUTCOMES.get(code, "error")


def slurm_endpoint(method: str, path: str) -> str:
    """``GET node`` for ``/slurm/v0.0.42/node/n1``: the method and the path's first segment
    below the version, never the node name."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["slurm"]:
        parts = parts[2:]
    return f"{method} {parts[0]}" if parts else method


def push_reason(reason: str) -> PushReason:
    """The bounded label for a push's free-text reason."""
    if reason.startswith("admitting"):
        return "admission"
    if reason == "drift":
        return "drift"
    if reason == "retry":
        return "retry"
    if reason.startswith("headroom"):
        return "headroom"
    # The admission service's changes without a confirmation: releases, the undo of a
    # refused hold, a pod another scheduler bound.
    if reason == "holdings changed" or reason.startswith("releas"):
        return "release"
    return "other"


class AdmissionTimer:
    """One admission: seconds spent per phase, and the phase an error escaped from."""

    __slots__ = ("failed_in", "seconds")

    def __init__(self) -> None:
        self.seconds: dict[Phase, float] = {}
        self.failed_in: Phase | None = None

    @contextmanager
    def phase(self, phase: Phase) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        except BaseException:
            self.failed_in = phase
            raise
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started


class _SlurmFreshness:
    """``nodeledger_slurm_staleness_seconds`` and ``nodeledger_slurm_up``, computed at
    scrape time, and only once a Slurm sync exists (no Slurm: no "Slurm down" series)."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        self.since: float | None = None  # the sync was built
        self.read_at: float | None = None  # the last successful read of Slurm
        self.up = False
        self.node_hint_at: float | None = None  # this replica last took a node hint

    def describe(self) -> Iterable[Metric]:
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        return self._families(self.since)

    def _families(self, since: float | None) -> list[Metric]:
        staleness = GaugeMetricFamily(
            "nodeledger_slurm_staleness_seconds",
            "Seconds since this replica last read Slurm successfully (since start if never)",
        )
        up = GaugeMetricFamily(
            "nodeledger_slurm_up", "1 when the last Slurm sync step reached slurmrestd"
        )
        node_hint = GaugeMetricFamily(
            "nodeledger_slurm_node_hint_age_seconds",
            "Seconds since this replica, leading the Slurm sync, last took a node hint or "
            "heartbeat of slurmctld's node watcher (absent until it takes one)",
        )
        if since is None:
            return []
        staleness.add_metric([], self.monotonic() - (self.read_at or since))
        up.add_metric([], 1.0 if self.up else 0.0)
        if self.node_hint_at is None:
            return [staleness, up]
        node_hint.add_metric([], self.monotonic() - self.node_hint_at)
        return [staleness, up, node_hint]


class Metrics:
    """Counters, histograms and gauges the components update; the ledger's own gauges come
    from app.metrics.nodes.LedgerCollector, registered on ``registry`` by the app."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        *,
        version: str = __version__,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``registry`` None: count, but registered nowhere (``NO_METRICS``)."""
        self.registry = registry
        r = registry
        Gauge("nodeledger_build_info", "Always 1", ["version"], registry=r).labels(version).set(1)
        self.admissions = Counter(
            "nodeledger_admissions",
            "Admissions answered, by way in and result",
            ["path", "result"],
            registry=r,
        )
        self.admissions_within_headroom = Counter(
            "nodeledger_admissions_within_headroom",
            "Admissions confirmed inside a node's headroom, without a Slurm call",
            registry=r,
        )
        self.releases = Counter(
            "nodeledger_releases", "Holdings released, by way in", ["path"], registry=r
        )
        self.admission_duration = Histogram(
            "nodeledger_admission_duration_seconds",
            "Time an admission spent in the ledger (hold + confirm) and in Slurm's confirmation",
            ["phase"],
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.extender_duration = Histogram(
            "nodeledger_extender_request_duration_seconds",
            "kube-scheduler extender calls, by verb: body read to response sent",
            ["verb"],
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.extender_bytes = Counter(
            "nodeledger_extender_bytes",
            "Bytes of the extender calls' bodies, by verb and direction (received, sent)",
            ["verb", "direction"],
            registry=r,
        )
        self.slurm_request_duration = Histogram(
            "nodeledger_slurm_request_duration_seconds",
            "slurmrestd requests (each attempt), by endpoint and outcome",
            ["endpoint", "outcome"],
            buckets=SLURM_BUCKETS,
            registry=r,
        )
        self.slurm_pushes = Counter(
            "nodeledger_slurm_pushes",
            "Pushes of the k8s* counts to a Slurm node that ran (read, update if different)",
            ["reason"],
            registry=r,
        )
        self.slurm_pushes_coalesced = Counter(
            "nodeledger_slurm_pushes_coalesced",
            "Push calls answered by a push another caller ran",
            registry=r,
        )
        self.slurm_drift_corrections = Counter(
            "nodeledger_slurm_drift_corrections",
            "Slurm nodes that had lost the pushed counts and got them again",
            registry=r,
        )
        self.slurm_sync_duration = Histogram(
            "nodeledger_slurm_sync_duration_seconds",
            "Duration of one Slurm sync step",
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.slurm_drifted = Gauge(
            "nodeledger_slurm_drifted_nodes",
            "Nodes whose Slurm counts differed from the ledger's at the last sync pass",
            registry=r,
        )
        self.leading = Gauge(
            "nodeledger_leader", "1 while this replica plays the role", ["role"], registry=r
        )
        self.watch_restarts = Counter(
            "nodeledger_kube_watch_restarts",
            "Kubernetes list-and-watch loops that broke off (error, 410 Gone) and started again",
            ["watch"],
            registry=r,
        )
        self.relists = Counter(
            "nodeledger_kube_relists",
            "Full Kubernetes lists after the first (a watch broke off or expired)",
            ["watch"],
            registry=r,
        )
        self.status_writes = Counter(
            "nodeledger_kube_status_writes",
            "GenericNode status writes (only nodes whose figures differ from Kubernetes')",
            registry=r,
        )
        self.placeholder_writes = Counter(
            "nodeledger_kube_placeholder_writes",
            "Placeholder pod creates, in-place resizes and deletes",
            registry=r,
        )
        self.placeholders_refused = Gauge(
            "nodeledger_kube_placeholders_refused",
            "Nodes whose placeholder pod the API server has refused (Pod Security, a "
            "LimitRange, a quota, an admission policy) for 10 s or more: labelled "
            "nodeledger.io/placeholder-refused, which the chart's scheduler keeps pods off",
            registry=r,
        )
        self.orphaned_pod_holdings = Gauge(
            "nodeledger_kube_orphaned_pod_holdings",
            "Pod holdings kept after their pod was deleted while its node was not Ready (a "
            "lost kubelet), until a proof that its containers stopped",
            registry=r,
        )
        self.slurm_plugins_ok = Gauge(
            "nodeledger_slurm_plugins_ok",
            "1 when slurmctld runs the plugins its release needs to share nodes safely "
            "(node_features/k8s_resources from 25.11 on); 0 when it does not (admissions "
            "refused with the check in enforce mode), or before the first check",
            registry=r,
        )
        self.dependency_up = Gauge(
            "nodeledger_dependency_up",
            "1 while the dependency (database, slurmrestd, kubernetes) answers this replica",
            ["dependency"],
            registry=r,
        )
        self.dependency_outages = Counter(
            "nodeledger_dependency_outages",
            "Times the dependency stopped answering this replica",
            ["dependency"],
            registry=r,
        )
        self.maintenance_disagreeing = Gauge(
            "nodeledger_maintenance_disagreeing_nodes",
            "Co-managed nodes one side keeps out and the other not (cordon or taint in "
            "Kubernetes, drain/down/fail in Slurm), as the kube-controllers leader sees",
            registry=r,
        )
        self.maintenance_oldest = Gauge(
            "nodeledger_maintenance_oldest_disagreement_seconds",
            "Seconds the longest of those disagreements has lasted (0: none)",
            registry=r,
        )
        self._freshness = _SlurmFreshness(monotonic)
        if registry is not None:
            registry.register(self._freshness)
        # Every series of a bounded label set exists from the start (rate() needs a zero).
        self._admitted = {
            (path, result): self.admissions.labels(path, result)
            for path in get_args(AdmissionPath)
            for result in get_args(AdmissionResult)
        }
        self._released = {path: self.releases.labels(path) for path in get_args(ReleasePath)}
        self._phases = {phase: self.admission_duration.labels(phase) for phase in get_args(Phase)}
        for reason in get_args(PushReason):
            self.slurm_pushes.labels(reason)
        for verb in get_args(ExtenderVerb):
            self.extender_duration.labels(verb)
            self.extender_bytes.labels(verb, "received")
            self.extender_bytes.labels(verb, "sent")
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ admissions

    @contextmanager
    def admitting(self, path: AdmissionPath) -> Iterator[AdmissionTimer]:
        """Counts the admission run in the block by its result and observes its phases."""
        timer = AdmissionTimer()
        try:
            yield timer
        except Exception as exc:
            result = admission_result(exc, timer.failed_in)
            if result is not None:
                self._admitted[path, result].inc()
            raise
        else:
            self._admitted[path, "admitted"].inc()
        finally:
            for phase, seconds in timer.seconds.items():
                self._phases[phase].observe(seconds)

    def admitted_within_headroom(self) -> None:
        self.admissions_within_headroom.inc()

    def released(self, path: ReleasePath) -> None:
        self._released[path].inc()

    def extender_called(self, verb: ExtenderVerb, seconds: float, received: int, sent: int) -> None:
        self.extender_duration.labels(verb).observe(seconds)
        self.extender_bytes.labels(verb, "received").inc(received)
        self.extender_bytes.labels(verb, "sent").inc(sent)

    # ------------------------------------------------------------------ Slurm

    @contextmanager
    def slurm_request(self, method: str, path: str) -> Iterator[None]:
        """Times one slurmrestd request and labels it by how it ended."""
        started = time.perf_counter()
        outcome: SlurmOutcome = "ok"
        try:
            yield
        except BaseException as exc:
            outcome = slurm_outcome(exc)
            raise
        finally:
            self.slurm_request_duration.labels(slurm_endpoint(method, path), outcome).observe(
                time.perf_counter() - started
            )

    def slurm_pushed(self, reason: str) -> None:
        self.slurm_pushes.labels(push_reason(reason)).inc()

    def slurm_push_coalesced(self) -> None:
        self.slurm_pushes_coalesced.inc()

    def slurm_drift_corrected(self) -> None:
        self.slurm_drift_corrections.inc()

    def slurm_drifted_nodes(self, count: int) -> None:
        self.slurm_drifted.set(count)

    def slurm_plugins(self, ok: bool) -> None:
        self.slurm_plugins_ok.set(1 if ok else 0)

    def slurm_sync_attached(self) -> None:
        """A Slurm sync exists: staleness and up are exposed from now on."""
        with self._lock:
            if self._freshness.since is None:
                self._freshness.since = self._freshness.monotonic()

    def slurm_reached(self, ok: bool) -> None:
        """A sync step read Slurm (``ok``) or could not."""
        with self._lock:
            self._freshness.up = ok
            if ok:
                self._freshness.read_at = self._freshness.monotonic()

    def slurm_node_hint_heard(self) -> None:
        """The Slurm sync leader took a node hint (or the watcher's heartbeat)."""
        with self._lock:
            self._freshness.node_hint_at = self._freshness.monotonic()

    @contextmanager
    def slurm_sync_step(self) -> Iterator[None]:
        with self.slurm_sync_duration.time():
            yield

    # ------------------------------------------------------------------ dependencies

    def dependency(self, name: str, *, up: bool, outage: bool) -> None:
        """``name`` (database, slurmrestd, kubernetes: a fixed set) answers or not;
        ``outage``: an outage began."""
        self.dependency_up.labels(name).set(1 if up else 0)
        counter = self.dependency_outages.labels(name)
        if outage:
            counter.inc()

    # ------------------------------------------------------------------ roles, watches

    def leader(self, role: LeaderRole, leading: bool) -> None:
        self.leading.labels(role).set(1 if leading else 0)

    def kube_watch(self, watch: str) -> None:
        """A list-and-watch exists: its counters start at zero."""
        self.watch_restarts.labels(watch)
        self.relists.labels(watch)

    def kube_watch_restarted(self, watch: str) -> None:
        self.watch_restarts.labels(watch).inc()

    def kube_relisted(self, watch: str) -> None:
        self.relists.labels(watch).inc()

    def kube_status_written(self) -> None:
        self.status_writes.inc()

    def kube_placeholder_written(self) -> None:
        self.placeholder_writes.inc()

    def kube_placeholders_refused(self, nodes: int) -> None:
        self.placeholders_refused.set(nodes)

    def kube_orphaned_pod_holdings(self, count: int) -> None:
        self.orphaned_pod_holdings.set(count)

    def maintenance_disagreements(self, nodes: int, oldest_seconds: float) -> None:
        """What the maintenance reconciler last found (zeros when it stops leading)."""
        self.maintenance_disagreeing.set(nodes)
        self.maintenance_oldest.set(oldest_seconds)


# Components built without a Metrics (unit tests, tools) count here; nothing exposes it.
NO_METRICS = Metrics(None)
