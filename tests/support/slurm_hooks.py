"""slurmctld's job hint hook pointed at a `nodeledger serve`, and that service's
environment (its tokens included), for the tests of hints on the real clusters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.slurm_cluster import SlurmCluster

HOOK_TOKEN = "slurmctld-hint-token-0123456789"
ADMIN_TOKEN = "test-admin-token-0123456789"


@contextmanager
def hook_posting_to(slurm: SlurmCluster, url: str) -> Iterator[None]:
    """slurmctld's hint hook posts to ``url`` (with HOOK_TOKEN) until the context ends."""
    config = slurm.hint_config
    if config is None:
        pytest.fail("this Slurm test cluster has no job hint hook (testenv/slurm/cluster.sh)")
    token = config.with_name("nodeledger-hint.token")
    token.write_text(HOOK_TOKEN)
    config.write_text(
        f"url={url}\ntoken_file=/etc/slurm/{token.name}\ntimeout=2\nlog=/srv/run/log/hint.log\n"
    )
    try:
        yield
    finally:
        config.unlink(missing_ok=True)
        token.unlink(missing_ok=True)


def service_env(slurm: SlurmCluster, tmp_path: Path) -> dict[str, str]:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            [
                {"user": "slurmctld", "token": HOOK_TOKEN, "allow": ["create jobhints"]},
                {"user": "test", "token": ADMIN_TOKEN, "allow": ["*"]},
            ]
        )
    )
    return {
        **slurm.service_env,
        "NODELEDGER_SLURM_FULL_SYNC_INTERVAL": "300",
        "NODELEDGER_AUTH_MODE": "static",
        "NODELEDGER_AUTH_TOKEN_FILE": str(tokens),
        "NODELEDGER_LOG_LEVEL": "info",
    }
