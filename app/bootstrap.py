"""The composition root: every part of the service built once, from settings, in the
order its parts depend on each other; nothing is attached or replaced afterwards.

The guard of the HTTP API (``build_guard``) is built here too, from the same settings.

Order: the database and the ledger; the read model (app.ledger.snapshot); the Slurm
integration, whose gate the admissions need; the admissions; the Kubernetes integration,
which admits through them and reads Slurm's node sizes. ``running`` starts the background
components in that order and stops them in reverse, each stop joining its threads, so a
reader never outlives what it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from cachetools import TTLCache
from prometheus_client import CollectorRegistry

from app.admission.service import AdmissionGate, Admissions
from app.auth.guard import Guard
from app.auth.reviews import AccessReviewer, Reviews, TokenReviewer
from app.auth.static import StaticTokens
from app.core.caps import KubeCaps
from app.core.components import Component, Health
from app.core.headroom import NO_POLICY
from app.core.resources import Resources
from app.core.slurm_models import LedgerHolds, SlurmJob
from app.db import migrate
from app.db.engine import Database, Liveness
from app.kube.client import KubeClient
from app.kube.controllers.device_taints import HoldsOf, SlurmJobs
from app.kube.controllers.discovery import SlurmSizes
from app.kube.extender.service import Extender
from app.kube.reviews import KubeReviews
from app.kube.wiring import KubeParts, build_kube
from app.ledger.service import Clock, Ledger, utcnow
from app.ledger.snapshot import NodeSnapshot
from app.metrics.nodes import LedgerCollector
from app.metrics.registry import Metrics
from app.outages import Dependency
from app.settings import Settings
from app.slurm.hint_queue import HintQueue
from app.slurm.sync import SlurmSync
from app.slurm.wiring import SlurmParts, build_slurm

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Services:
    """Everything the routers and the background components share."""

    settings: Settings
    db: Database
    ledger: Ledger
    admissions: Admissions
    snapshot: NodeSnapshot  # the read model: every node view, for those that read many
    metrics: Metrics
    # What this replica sees of the database, slurmrestd, the Kubernetes API (app.outages).
    dependencies: Mapping[str, Dependency]
    components: tuple[Component, ...] = ()  # in start order
    slurm: SlurmSync | None = None
    job_hints: HintQueue | None = None  # with the Slurm integration on
    extender: Extender | None = None  # with the Kubernetes integration on

    @property
    def database(self) -> Dependency:
        return self.dependencies["database"]


GateFactory = Callable[[Ledger, Metrics], AdmissionGate | None]


def build_services(
    settings: Settings, *, clock: Clock = utcnow, gate: GateFactory | None = None
) -> Services:
    """``gate``: builds an admission gate of the caller's, in place of Slurm's (tests)."""
    liveness = Liveness(
        idle_seconds=settings.db_keepalives_idle_seconds,
        interval_seconds=settings.db_keepalives_interval_seconds,
        count=settings.db_keepalives_count,
        user_timeout_seconds=settings.db_tcp_user_timeout_seconds,
    )
    db = Database.from_url(
        settings.database_url, pool_size=settings.db_pool_size, liveness=liveness
    )
    if settings.migrate_on_start:
        migrate.upgrade(db.engine)
    registry = CollectorRegistry()  # one per app: tests build many apps in one process
    metrics = Metrics(registry)
    dependencies = {
        name: Dependency(name, metrics=metrics)
        for name, on in (
            ("database", True),
            ("slurmrestd", settings.slurm.enabled),
            ("kubernetes", settings.kube.enabled),
        )
        if on
    }
    database = dependencies["database"]
    db.watch(database.failed, database.answered)
    caps = (
        KubeCaps(settings.slurm.kube_max_cpu_fraction, settings.slurm.kube_max_memory_fraction)
        if settings.slurm.enabled
        else None
    )
    headroom = settings.slurm.headroom_policy(caps) if caps is not None else NO_POLICY
    ledger = Ledger(db, clock, headroom=headroom)
    snapshot = NodeSnapshot(ledger)
    integrated = settings.slurm.enabled or settings.kube.enabled
    registry.register(
        LedgerCollector(
            # With an integration on, the snapshot runs for its readers: scrapes read it too.
            snapshot.list_nodes if integrated else ledger.node_totals,
            per_node=settings.metrics.per_node,
            cache_seconds=settings.metrics.cache_seconds,
        )
    )
    slurm: SlurmParts | None = None
    if settings.slurm.enabled and caps is not None:
        slurm = build_slurm(
            settings.slurm,
            db,
            ledger,
            snapshot,
            caps,
            metrics,
            dependencies["slurmrestd"],
        )
    admission_gate = (
        gate(ledger, metrics) if gate is not None else slurm.gate if slurm is not None else None
    )
    admissions = Admissions(ledger, admission_gate, metrics=metrics)
    kube: KubeParts | None = None
    if settings.kube.enabled:
        kube = build_kube(
            settings.kube,
            admissions,
            snapshot,
            caps,
            *_slurm_for_kube(slurm.sync if slurm is not None else None, snapshot),
            metrics,
            dependencies["kubernetes"],
            clock,
            slurm.drains if slurm is not None else None,
        )
    components: list[Component] = []
    if integrated:
        components.append(snapshot)  # its readers' first component
    if slurm is not None:
        components += slurm.components
    if kube is not None:
        components.append(kube.controllers)
    return Services(
        settings=settings,
        db=db,
        ledger=ledger,
        admissions=admissions,
        snapshot=snapshot,
        metrics=metrics,
        dependencies=dependencies,
        components=tuple(components),
        slurm=slurm.sync if slurm is not None else None,
        job_hints=slurm.hints if slurm is not None else None,
        extender=kube.extender if kube is not None else None,
    )


def _slurm_for_kube(
    sync: SlurmSync | None, views: NodeSnapshot
) -> tuple[SlurmSizes, Callable[[], Health | None], SlurmJobs, HoldsOf]:
    """What the Kubernetes controllers read of the Slurm sync, a node's size, the sync's
    health (None without it), its jobs by node as last listed (None while its last read
    failed: the device taints keep what they have) and which of them are the ledger's hold
    jobs (recorded in ``views``, the service's Slurm user's): built here, so that app.kube
    knows nothing of app.slurm."""

    def sizes(name: str) -> Resources | None:
        return sync.state.snapshot().node_size(name) if sync is not None else None

    def health() -> Health | None:
        return sync.health() if sync is not None else None

    def jobs() -> Mapping[str, Mapping[str, SlurmJob]] | None:
        if sync is None or not sync.listings_read:
            return None
        return sync.state.snapshot().jobs_by_node

    def holds() -> LedgerHolds:
        user = sync.client.user_name if sync is not None else ""
        # The read model as last refreshed: asked at every look for a new listing.
        held = (h for v in views.latest().values() for h in v.holdings)
        return LedgerHolds.of(user, held)

    return sizes, health, jobs, holds


@contextmanager
def running(services: Services) -> Iterator[Services]:
    """Start the components in order; on exit stop the started ones in reverse (each
    joins its threads) and close the database's connections."""
    started: list[Component] = []
    try:
        for component in services.components:
            component.start()
            started.append(component)
        yield services
    finally:
        for component in reversed(started):
            try:
                component.stop()
            except Exception:
                log.exception("stopping %s failed", component.name)
        services.db.dispose()


def build_guard(settings: Settings, *, reviews: Reviews | None = None) -> Guard:
    """``reviews``: the TokenReview/SubjectAccessReview calls (default: through a KubeClient
    of NODELEDGER_KUBE_KUBECONFIG, in-cluster when unset)."""
    auth = settings.auth
    reads = "reads need a caller too" if auth.protect_reads else "reads are open"
    if auth.mode == "none":
        log.warning("NODELEDGER_AUTH_MODE=none: anyone who reaches the API may change the ledger")
        return Guard()
    if auth.mode == "static":
        assert auth.token_file is not None  # AuthSettings checks it
        tokens = StaticTokens(auth.token_file)
        log.info("authentication: static tokens from %s; %s", auth.token_file, reads)
        return Guard(tokens, tokens, protect_reads=auth.protect_reads)
    if reviews is None:
        reviews = KubeReviews(KubeClient(settings.kube.kubeconfig, timeout=auth.review_timeout))
    log.info("authentication: Kubernetes TokenReview and SubjectAccessReview; %s", reads)
    return Guard(
        # Bounded, expiring; used from the event loop only, so no lock.
        TokenReviewer(reviews, TTLCache(maxsize=auth.cache_size, ttl=auth.cache_ttl)),
        AccessReviewer(reviews, TTLCache(maxsize=auth.cache_size, ttl=auth.cache_ttl)),
        protect_reads=auth.protect_reads,
    )
