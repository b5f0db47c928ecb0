"""Configuration from NODELEDGER_* environment variables, built once in the entrypoint
and passed down; library modules never read the environment themselves."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.auth.settings import AuthSettings
from app.kube.settings import KubeSettings
from app.logs import LogFormat
from app.metrics.settings import MetricsSettings
from app.slurm.settings import SlurmSettings

LogLevel = Literal["debug", "info", "warning", "error", "critical"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NODELEDGER_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///nodeledger.db",
        description="SQLAlchemy URL: sqlite:///PATH (default) or postgresql://user:pw@host/db",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    log_level: LogLevel = "info"
    log_library_level: LogLevel = Field(
        default="warning",
        description="Level of the client libraries' own loggers (httpx, urllib3, kubernetes): "
        "debug or info shows every request they make",
    )
    log_format: LogFormat = Field(default="text", description="text, or json: one object per line")
    db_pool_size: int = Field(default=10, ge=1, le=200)
    db_keepalives_idle_seconds: int = Field(
        default=5,
        ge=1,
        le=7200,
        description="PostgreSQL: seconds of silence on a connection before either end probes "
        "its peer (TCP keepalive, set on both ends)",
    )
    db_keepalives_interval_seconds: int = Field(
        default=2, ge=1, le=600, description="PostgreSQL: seconds between unanswered probes"
    )
    db_keepalives_count: int = Field(
        default=3,
        ge=1,
        le=100,
        description="PostgreSQL: unanswered probes after which a connection is dropped, and "
        "with it a dead replica's locks (the Slurm sync's leadership, node locks)",
    )
    db_tcp_user_timeout_seconds: int = Field(
        default=10,
        ge=1,
        le=7200,
        description="PostgreSQL: seconds sent data may stay unacknowledged before either end "
        "drops the connection (TCP_USER_TIMEOUT)",
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=1024**3,
        description="Request bodies larger than this are refused (413) before they are read",
    )
    request_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description=(
            "A request's head, then its body, must each arrive whole within this many seconds "
            "(a slow head has its connection closed; a slow body gets 408)"
        ),
    )
    migrate_on_start: bool = Field(default=True, description="Run Alembic upgrade before serving")
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
