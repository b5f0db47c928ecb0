"""Kubernetes integration settings (NODELEDGER_KUBE_*)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class KubeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NODELEDGER_KUBE_", extra="ignore")

    enabled: bool = False
