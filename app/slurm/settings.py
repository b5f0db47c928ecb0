"""Slurm integration settings (NODELEDGER_SLURM_*)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class SlurmSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NODELEDGER_SLURM_", extra="ignore")

    enabled: bool = False
