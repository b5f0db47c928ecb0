"""Initial ledger schema: nodes, holdings, events.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.types import UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("slurm_name", sa.String(253), nullable=True),
        sa.Column("cpu_millis", sa.BigInteger(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.BigInteger(), nullable=False),
        sa.Column("reserved_cpu_millis", sa.BigInteger(), nullable=False),
        sa.Column("reserved_memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("reserved_gpus", sa.BigInteger(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("cordon_reason", sa.Text(), nullable=True),
        sa.Column("health_reason", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
    )
    op.create_table(
        "holdings",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("holder_kind", sa.String(16), nullable=False),
        sa.Column("holder_id", sa.String(253), nullable=False),
        sa.Column("display_name", sa.String(507), nullable=False),
        sa.Column("cpu_millis", sa.BigInteger(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_holdings")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_holdings_node_id_nodes"), ondelete="RESTRICT"
        ),
        sa.UniqueConstraint(
            "node_id",
            "holder_kind",
            "holder_id",
            name=op.f("uq_holdings_node_id_holder_kind_holder_id"),
        ),
    )
    op.create_index(op.f("ix_holdings_node_id"), "holdings", ["node_id"])
    op.create_index(
        "uq_holdings_single_node_holder",
        "holdings",
        ["holder_kind", "holder_id"],
        unique=True,
        sqlite_where=sa.text("holder_kind != 'slurm_job'"),
        postgresql_where=sa.text("holder_kind != 'slurm_job'"),
    )
    op.create_table(
        "events",
        sa.Column("id", BigId, primary_key=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("node", sa.String(253), nullable=True),
        sa.Column("holder_kind", sa.String(16), nullable=True),
        sa.Column("holder_id", sa.String(253), nullable=True),
        sa.Column("cpu_millis", sa.BigInteger(), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("gpus", sa.BigInteger(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_at"), "events", ["at"])
    op.create_index("ix_events_node_id", "events", ["node", "id"])


def downgrade() -> None:
    op.drop_index("ix_events_node_id", table_name="events")
    op.drop_index(op.f("ix_events_at"), table_name="events")
    op.drop_table("events")
    op.drop_index("uq_holdings_single_node_holder", table_name="holdings")
    op.drop_index(op.f("ix_holdings_node_id"), table_name="holdings")
    op.drop_table("holdings")
    op.drop_table("nodes")
