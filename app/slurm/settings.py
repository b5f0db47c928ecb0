"""Slurm integration settings (NODELEDGER_SLURM_*)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.caps import KubeCaps
from app.core.headroom import HeadroomPolicy
from app.core.quantities import Rounding, cpu_millis, memory_bytes
from app.core.resources import Resources


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
    jobs_queue: bool = Field(
        default=True,
        description=(
            "Jobs larger than what pods leave queue (Reason=Constraints) instead of failing "
            "at submit: marks every node's Extra; takes effect where slurm.conf has "
            "SchedulerParameters=extra_constraints (without it, such jobs fail at submit)"
        ),
    )
    kube_max_cpu_fraction: float = Field(
        default=1.0, ge=0, le=1, description="Share of a node's CPUs Kubernetes may hold"
    )
    kube_max_memory_fraction: float = Field(
        default=1.0, ge=0, le=1, description="Share of a node's memory Kubernetes may hold"
    )
    headroom_cpu: str = Field(
        default="0",
        description="Kubernetes headroom: CPUs withheld from Slurm on a node beyond what pods "
        "hold, so that admissions inside it need no Slurm call (a quantity; 0: none). "
        "Label nodeledger.io/headroom-cpu overrides it per node",
    )
    headroom_memory: str = Field(
        default="0",
        description="Headroom memory (a quantity, e.g. 4Gi); label nodeledger.io/headroom-memory",
    )
    headroom_gpus: int = Field(
        default=0, ge=0, le=1024, description="Headroom GPUs; label nodeledger.io/headroom-gpu"
    )
    headroom_low_water: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Refill a node's headroom, off the admission path, when less than this "
        "share of it is left",
    )
    headroom_grow_step: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="When an admission does not fit the headroom, grow it by this many "
        "times the node's amount",
    )
    headroom_max_factor: float = Field(
        default=4.0,
        ge=1,
        le=1000,
        description="Never grow the headroom beyond this many times the node's amount; what "
        "released pods free stays withheld as headroom up to this too",
    )
    headroom_idle_seconds: float = Field(
        default=300.0,
        gt=0,
        le=7 * 86400,
        description="Give the headroom back to Slurm after this long without an admission",
    )

    @field_validator("headroom_cpu", "headroom_memory")
    @classmethod
    def _quantity(cls, value: str, info: ValidationInfo) -> str:
        parse = cpu_millis if info.field_name == "headroom_cpu" else memory_bytes
        if parse(value, Rounding.DOWN) < 0:
            raise ValueError("must not be negative")
        return value

    def headroom_policy(self, caps: KubeCaps) -> HeadroomPolicy:
        return HeadroomPolicy(
            amount=Resources(
                cpu_millis(self.headroom_cpu, Rounding.DOWN),
                memory_bytes(self.headroom_memory, Rounding.DOWN),
                self.headroom_gpus,
            ),
            low_water=self.headroom_low_water,
            grow_step=self.headroom_grow_step,
            max_factor=self.headroom_max_factor,
            idle_seconds=self.headroom_idle_seconds,
            caps=caps,
        )
