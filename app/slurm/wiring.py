"""The Slurm integration's parts, built from its settings (called by app.bootstrap)."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.caps import KubeCaps
from app.core.components import Component
from app.db.engine import Database
from app.db.locks import Leadership
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import Metrics
from app.outages import Dependency
from app.slurm.client import SlurmClient
from app.slurm.deferred import DeferredPushes
from app.slurm.drains import SlurmDrains
from app.slurm.gate import SlurmGate
from app.slurm.hint_queue import HintQueue
from app.slurm.holds import HoldJobs
from app.slurm.plugins import PluginCheck
from app.slurm.push import Pusher
from app.slurm.settings import SlurmSettings
from app.slurm.sync import SlurmSync
from app.slurm.tokens import FileToken, StaticToken, TokenSource
from app.slurm.witness import SlurmWitness


@dataclass(frozen=True, slots=True)
class SlurmParts:
    sync: SlurmSync
    gate: SlurmGate
    hints: HintQueue
    components: tuple[Component, ...]  # in start order
    drains: SlurmDrains  # for the Kubernetes side's cordons


def token_source(settings: SlurmSettings) -> TokenSource:
    if settings.token_file is not None:
        return FileToken(settings.token_file)
    if settings.token is not None:
        return StaticToken(settings.token.get_secret_value())
    raise ValueError(
        "Slurm integration needs a token: set NODELEDGER_SLURM_TOKEN_FILE or NODELEDGER_SLURM_TOKEN"
    )


def build_slurm(
    settings: SlurmSettings,
    db: Database,
    ledger: Ledger,
    views: NodeSnapshot,
    caps: KubeCaps,
    metrics: Metrics,
    availability: Dependency,
) -> SlurmParts:
    """The sync component, the admission gate and the plugin check (unless off)."""
    client = SlurmClient(
        settings.url,
        token_source(settings),
        user_name=settings.user_name,
        timeout=settings.timeout,
        retries=settings.retries,
        api_version=settings.api_version,
        metrics=metrics,
        availability=availability,
    )
    # The fast path's witness goes stale after ten sync intervals without a read of
    # slurmctld (30 s at least: a full pass at scale takes a while).
    witness = SlurmWitness(max_age=max(30.0, 10 * settings.sync_interval))
    pusher = Pusher(client, ledger, metrics=metrics, witness=witness, marked=settings.jobs_queue)
    hints = HintQueue(db)
    holds = HoldJobs(client)
    sync = SlurmSync(
        client,
        ledger,
        pusher,
        interval=settings.sync_interval,
        full_sync_interval=settings.full_sync_interval,
        hints=hints,
        register_nodes=settings.register_nodes,
        pending_timeout=settings.pending_timeout,
        leadership=Leadership(db, "slurm-sync"),
        metrics=metrics,
        views=views,
        holds=holds,
    )
    plugins = (
        PluginCheck(
            client,
            mode=settings.plugin_check,
            interval=settings.plugin_check_interval,
            metrics=metrics,
        )
        if settings.plugin_check != "off"
        else None
    )
    deferred = DeferredPushes(pusher)
    gate = SlurmGate(
        pusher,
        caps,
        fail_open=settings.fail_open,
        # Slurm's state as the sync's thread last published it.
        jobs_on=lambda name: sync.state.snapshot().jobs_on(name),
        refusal=plugins.refusal if plugins is not None else lambda: None,
        defer_push=deferred.defer_push,
        holds=holds,
        contended=lambda: sync.contended,
    )
    components: tuple[Component, ...] = (
        (sync, deferred) if plugins is None else (sync, deferred, plugins)
    )
    return SlurmParts(sync, gate, hints, components, SlurmDrains(client))
