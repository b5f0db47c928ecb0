"""Authentication, authorization and TLS settings (NODELEDGER_AUTH_*)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

AuthMode = Literal["none", "static", "kubernetes"]


class AuthSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NODELEDGER_AUTH_", extra="ignore")

    mode: AuthMode = Field(
        default="none",
        description="none: anyone may write; static: tokens from token_file; kubernetes: "
        "TokenReview + SubjectAccessReview",
    )
    protect_reads: bool = Field(
        default=False, description="Reads (GET, extender filter/prioritize) need a caller too"
    )
    token_file: Path | None = Field(
        default=None, description="static mode: JSON list of tokens and permissions"
    )
    cache_ttl: float = Field(
        default=5.0, ge=0, le=300, description="Seconds a review result (yes or no) is reused"
    )
    cache_size: int = Field(default=4096, ge=1, description="Review results kept at most")
    review_timeout: float = Field(
        default=5.0, gt=0, le=60, description="Seconds per TokenReview/SubjectAccessReview"
    )
    tls_cert_file: Path | None = Field(default=None, description="Serve HTTPS with this cert")
    tls_key_file: Path | None = Field(default=None, description="... and this private key")
    tls_client_ca_file: Path | None = Field(
        default=None, description="Accept client certificates signed by this CA as identities"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.mode == "static" and self.token_file is None:
            raise ValueError("NODELEDGER_AUTH_MODE=static needs NODELEDGER_AUTH_TOKEN_FILE")
        if self.mode == "none" and self.protect_reads:
            raise ValueError("NODELEDGER_AUTH_PROTECT_READS needs a NODELEDGER_AUTH_MODE")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set both NODELEDGER_AUTH_TLS_CERT_FILE and _TLS_KEY_FILE, or none")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("NODELEDGER_AUTH_TLS_CLIENT_CA_FILE needs HTTPS (_TLS_CERT_FILE)")
        return self
