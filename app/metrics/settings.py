"""Metrics settings (NODELEDGER_METRICS_*)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class MetricsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NODELEDGER_METRICS_", extra="ignore")

    per_node: bool = Field(
        default=True,
        description="Per-node series (nodeledger_node_*): 8 per node and resource plus one "
        "per node; switch off above ~2,000 nodes (cluster totals stay)",
    )
    cache_seconds: float = Field(
        default=5.0, ge=0, le=300, description="At most one ledger read per this many seconds"
    )
