"""GPU devices held by identity (issue 23): a holding's device indices on its node, their
UUIDs (informational) and the Slurm job that holds them for it. Existing holdings name no
device (their GPUs stay counted only) and have no hold job.

Downgrading drops all three: a device holding becomes a counted one (its GPUs stay held by
count); its hold job, if any, is then no longer known to the ledger.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("holdings") as batch:
        batch.add_column(
            sa.Column("devices", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )
        batch.add_column(sa.Column("slurm_hold", sa.String(64), nullable=True))
        batch.add_column(
            sa.Column("device_uuids", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("holdings") as batch:
        batch.drop_column("device_uuids")
        batch.drop_column("slurm_hold")
        batch.drop_column("devices")
