"""Builds the Slurm integration into the service when it is enabled."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.db.locks import Leadership
from app.slurm.client import SlurmClient
from app.slurm.gate import SlurmGate
from app.slurm.hints import JobHints
from app.slurm.plugins import PluginCheck
from app.slurm.push import Pusher
from app.slurm.sync import SlurmSync
from app.slurm.tokens import FileToken, StaticToken, TokenSource

if TYPE_CHECKING:
    from app.main import Services
    from app.settings import Settings
    from app.slurm.settings import SlurmSettings


def token_source(settings: SlurmSettings) -> TokenSource:
    if settings.token_file is not None:
        return FileToken(settings.token_file)
    if settings.token is not None:
        return StaticToken(settings.token.get_secret_value())
    raise ValueError(
        "Slurm integration needs a token: set NODELEDGER_SLURM_TOKEN_FILE or NODELEDGER_SLURM_TOKEN"
    )


def attach_slurm(services: Services, settings: Settings) -> None:
    """Install the Slurm admission gate and the sync component (when enabled)."""
    slurm = settings.slurm
    if not slurm.enabled:
        return
    client = SlurmClient(
        slurm.url,
        token_source(slurm),
        user_name=slurm.user_name,
        timeout=slurm.timeout,
        retries=slurm.retries,
        api_version=slurm.api_version,
        metrics=services.metrics,
        availability=services.dependency("slurmrestd"),
    )
    pusher = Pusher(client, services.ledger, metrics=services.metrics)
    caps = services.kube_caps
    assert caps is not None  # built whenever Slurm is on
    services.job_hints = JobHints(services.db)
    services.slurm = SlurmSync(
        client,
        services.ledger,
        pusher,
        interval=slurm.sync_interval,
        full_sync_interval=slurm.full_sync_interval,
        hints=services.job_hints,
        register_nodes=slurm.register_nodes,
        pending_timeout=slurm.pending_timeout,
        leadership=Leadership(services.db, "slurm-sync"),
        metrics=services.metrics,
        views=services.snapshot,
    )
    plugins = None
    if slurm.plugin_check != "off":
        plugins = PluginCheck(
            client,
            mode=slurm.plugin_check,
            interval=slurm.plugin_check_interval,
            metrics=services.metrics,
        )
    services.admissions.gate = SlurmGate(
        pusher,
        caps,
        fail_open=slurm.fail_open,
        jobs_on=services.slurm.jobs_on,
        refusal=plugins.refusal if plugins is not None else lambda: None,
    )
    services.components.append(services.slurm)
    if plugins is not None:
        services.components.append(plugins)
