"""Slurm job hints: "job N changed" from slurmctld, waiting for the sync leader.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "slurm_job_hints",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slurm_job_hints")),
    )


def downgrade() -> None:
    op.drop_table("slurm_job_hints")
