"""One ledger node per Slurm node (issue 30): a unique index on the Slurm node each ledger
node maps to, its ``slurm_name`` or else its name. Two ledger nodes on one Slurm node
pushed their counts over each other's, each undoing the other's.

Existing rows are kept as they are. A ledger that already maps two nodes to one Slurm node
cannot get the index: the upgrade stops, naming them, and an operator gives one of each
pair another ``slurm_name`` (or deletes it), since which one Slurm should follow is theirs
to say. Downgrading drops the index.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TARGET = "coalesce(slurm_name, name)"


def upgrade() -> None:
    shared = (
        op.get_bind()
        .execute(
            sa.text(
                f"SELECT {_TARGET} AS target, name FROM nodes WHERE {_TARGET} IN "
                f"(SELECT {_TARGET} FROM nodes GROUP BY {_TARGET} HAVING count(*) > 1) "
                "ORDER BY target, name"
            )
        )
        .all()
    )
    if shared:
        pairs: dict[str, list[str]] = {}
        for target, name in shared:
            pairs.setdefault(target, []).append(name)
        listed = "; ".join(f"{t}: {', '.join(names)}" for t, names in pairs.items())
        raise RuntimeError(
            "several ledger nodes map to one Slurm node (Slurm node: ledger nodes): "
            f"{listed}. Give all but one of each another slurm_name (PUT /v1/nodes/NAME) "
            "with the previous release, then upgrade again."
        )
    op.create_index(
        "uq_nodes_slurm_target",
        "nodes",
        [sa.text(_TARGET)],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("uq_nodes_slurm_target", table_name="nodes")
