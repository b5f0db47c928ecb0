"""The Kubernetes headroom per node: its target, what Slurm was confirmed to withhold, and
the last admission (app.core.headroom). Existing nodes start with none.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import UTCDateTime

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AMOUNTS = (
    "headroom_cpu_millis",
    "headroom_memory_bytes",
    "headroom_gpus",
    "granted_cpu_millis",
    "granted_memory_bytes",
    "granted_gpus",
)


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        for name in AMOUNTS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("headroom_used_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        for name in (*AMOUNTS, "headroom_used_at"):
            batch.drop_column(name)
