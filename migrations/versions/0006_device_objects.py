"""GPU devices as one object each (issue 32): ``holdings.devices`` holds
``{"index": 0, "uuid": "GPU-..."}`` per device ("" when the UUID is not known), where it held
the indices beside a parallel ``device_uuids`` column, which goes.

Every row is converted, keeping its data: each index with the UUID at its place in
``device_uuids`` ("" where that had none). Downgrading splits them back into the two
columns (``device_uuids`` [] when no UUID is known, as the previous release wrote it).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HOLDINGS = sa.table(
    "holdings",
    sa.column("id", sa.BigInteger()),
    sa.column("devices", sa.JSON()),
    sa.column("device_uuids", sa.JSON()),
)


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.select(_HOLDINGS.c.id, _HOLDINGS.c.devices, _HOLDINGS.c.device_uuids))
    for holding_id, devices, uuids in rows.all():
        if devices:
            known = uuids or [""] * len(devices)
            objects = [{"index": d, "uuid": u} for d, u in zip(devices, known, strict=True)]
            _set(bind, holding_id, devices=objects)
    with _nodes_reflected(), op.batch_alter_table("holdings") as batch:
        batch.drop_column("device_uuids")


def downgrade() -> None:
    with _nodes_reflected(), op.batch_alter_table("holdings") as batch:
        batch.add_column(
            sa.Column("device_uuids", sa.JSON(), nullable=False, server_default=sa.text("'[]'"))
        )
    bind = op.get_bind()
    for holding_id, devices in bind.execute(sa.select(_HOLDINGS.c.id, _HOLDINGS.c.devices)).all():
        if devices:
            uuids = [d.get("uuid", "") for d in devices]
            indices = [d["index"] for d in devices]
            _set(bind, holding_id, devices=indices, device_uuids=uuids if any(uuids) else [])


@contextlib.contextmanager
def _nodes_reflected() -> Iterator[None]:
    """SQLite's batch copy reflects ``nodes`` for the foreign key, whose expression index
    (uq_nodes_slurm_target) SQLAlchemy cannot reflect and says so: that table is not
    copied, so the warning is noise on every new database."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Skipped unsupported reflection", sa.exc.SAWarning)
        yield


def _set(bind: sa.Connection, holding_id: int, **values: Any) -> None:
    bind.execute(sa.update(_HOLDINGS).where(_HOLDINGS.c.id == holding_id).values(**values))
