"""Slurm integration settings (NODELEDGER_SLURM_*)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class SlurmSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NODELEDGER_SLURM_", extra="ignore")

    enabled: bool = Field(default=False, description="Sync with Slurm and confirm admissions")
    url: str = Field(default="http://127.0.0.1:6820", description="slurmrestd base URL")
    token_file: Path | None = Field(
        default=None, description="JWT file, re-read when it changes (a mounted Secret)"
    )
    token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("NODELEDGER_SLURM_TOKEN", "SLURM_JWT"),
        description="JWT, when no token file is given",
    )
    user_name: str = Field(default="slurm", description="X-SLURM-USER-NAME (root or SlurmUser)")
    api_version: str | None = Field(
        default=None, pattern=r"^v0\.0\.\d+$", description="Pin a version; default: newest offered"
    )
    timeout: float = Field(default=5.0, gt=0, le=120, description="Seconds per slurmrestd call")
    retries: int = Field(default=2, ge=0, le=10, description="Retries of idempotent calls")
    sync_interval: float = Field(default=1.0, gt=0, le=3600, description="Seconds between syncs")
    full_sync_interval: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="Seconds between full listings of nodes and jobs, read in the background, "
        "when slurmctld sends job hints; unset: every sync interval",
    )
    pending_timeout: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="Seconds after which a hold whose admission never finished is released",
    )
    plugin_check: Literal["enforce", "warn", "off"] = Field(
        default="enforce",
        description="Slurm >= 25.11 without NodeFeaturesPlugins=node_features/k8s_resources: "
        "enforce refuses admissions, warn only says so (/readyz, metric, log), off skips it",
    )
    plugin_check_interval: float = Field(
        default=60.0, gt=0, le=3600, description="Seconds between checks of slurmctld's plugins"
    )
    fail_open: bool = Field(
        default=False, description="Admit when Slurm cannot confirm (default: reject)"
    )
    register_nodes: bool = Field(
        default=False, description="Add every Slurm node to the ledger with Slurm's sizes"
    )
    kube_max_cpu_fraction: float = Field(
        default=1.0, ge=0, le=1, description="Share of a node's CPUs Kubernetes may hold"
    )
    kube_max_memory_fraction: float = Field(
        default=1.0, ge=0, le=1, description="Share of a node's memory Kubernetes may hold"
    )
