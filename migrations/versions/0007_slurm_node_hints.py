"""Slurm node hints: "node N changed state" from slurmctld, waiting for the sync leader.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "slurm_node_hints",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("node", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slurm_node_hints")),
    )


def downgrade() -> None:
    op.drop_table("slurm_node_hints")
