"""SQL tables of the ledger (SQLAlchemy 2 typed mappings). Created only by Alembic."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from app.core.records import HeldDevice
from app.db.types import UTCDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments INTEGER PRIMARY KEY; BigInteger elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def device_objects(devices: Iterable[HeldDevice]) -> list[dict[str, Any]]:
    """GPU devices as ``holdings.devices`` keeps them: ``{"index": 0, "uuid": "GPU-..."}``
    each ("" when the UUID is not known), the shape of the REST API's."""
    return [{"index": d.index, "uuid": d.uuid} for d in devices]


def stored_devices(stored: list[dict[str, Any]] | None) -> tuple[HeldDevice, ...]:
    """The devices ``holdings.devices`` keeps (device_objects), as records."""
    return tuple(HeldDevice(d["index"], d.get("uuid", "")) for d in stored) if stored else ()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class NodeRow(Base):
    __tablename__ = "nodes"
    __table_args__ = (
        # One ledger node per Slurm node: two would push over each other's counts.
        Index(
            "uq_nodes_slurm_target",
            func.coalesce(text("slurm_name"), text("name")),
            unique=True,
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(253), unique=True)
    slurm_name: Mapped[str | None] = mapped_column(String(253))
    cpu_millis: Mapped[int] = mapped_column(BigInteger)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    gpus: Mapped[int] = mapped_column(BigInteger)
    reserved_cpu_millis: Mapped[int] = mapped_column(BigInteger)
    reserved_memory_bytes: Mapped[int] = mapped_column(BigInteger)
    reserved_gpus: Mapped[int] = mapped_column(BigInteger)
    labels: Mapped[dict[str, str]] = mapped_column(JSON)
    # Set by an operator (PUT), kept until cleared.
    cordon_reason: Mapped[str | None] = mapped_column(Text)
    # Set by integrations (e.g. Slurm says DRAIN); replaced on every sync.
    health_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # The Kubernetes headroom (app.core.headroom): the target kept withheld beyond what is
    # held, what Slurm was last confirmed to withhold, and the last admission.
    headroom_cpu_millis: Mapped[int] = mapped_column(BigInteger, server_default="0")
    headroom_memory_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")
    headroom_gpus: Mapped[int] = mapped_column(BigInteger, server_default="0")
    granted_cpu_millis: Mapped[int] = mapped_column(BigInteger, server_default="0")
    granted_memory_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")
    granted_gpus: Mapped[int] = mapped_column(BigInteger, server_default="0")
    headroom_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    holdings: Mapped[list[HoldingRow]] = relationship(back_populates="node", lazy="raise")


class HoldingRow(Base):
    __tablename__ = "holdings"
    __table_args__ = (
        UniqueConstraint("node_id", "holder_kind", "holder_id"),
        # A pod or a manual reservation holds on one node only; a Slurm job may span nodes.
        Index(
            "uq_holdings_single_node_holder",
            "holder_kind",
            "holder_id",
            unique=True,
            sqlite_where=text("holder_kind != 'slurm_job'"),
            postgresql_where=text("holder_kind != 'slurm_job'"),
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("nodes.id", ondelete="RESTRICT"), index=True
    )
    holder_kind: Mapped[str] = mapped_column(String(16))
    holder_id: Mapped[str] = mapped_column(String(253))
    display_name: Mapped[str] = mapped_column(String(507))
    cpu_millis: Mapped[int] = mapped_column(BigInteger)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    gpus: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # GPU devices held by identity: one object per device, by index, as
    # device_objects writes them ([] = counted only), and the Slurm job holding them once
    # confirmed. A write that names no device leaves them to the server's default: the
    # common admission's insert is unchanged.
    devices: Mapped[list[dict[str, Any]]] = mapped_column(JSON, server_default=text("'[]'"))
    slurm_hold: Mapped[str | None] = mapped_column(String(64))

    node: Mapped[NodeRow] = relationship(back_populates="holdings", lazy="raise")


class EventRow(Base):
    """Append-only: rows are inserted, never updated or deleted by the service."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_node_id", "node", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    kind: Mapped[str] = mapped_column(String(32))
    # Plain names, not foreign keys: the history outlives deleted nodes.
    node: Mapped[str | None] = mapped_column(String(253))
    holder_kind: Mapped[str | None] = mapped_column(String(16))
    holder_id: Mapped[str | None] = mapped_column(String(253))
    cpu_millis: Mapped[int | None] = mapped_column(BigInteger)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpus: Mapped[int | None] = mapped_column(BigInteger)
    message: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSON)


class SlurmJobHintRow(Base):
    """A "job N changed" hint from slurmctld, kept until the Slurm sync leader takes it
    (app.slurm.hint_queue): any replica may receive it, only the leader applies it."""

    __tablename__ = "slurm_job_hints"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger)


class SlurmNodeHintRow(Base):
    """A "node N changed state" hint from slurmctld (its node_features plugin), kept like
    a job hint until the sync leader takes it; ``node`` "*": every node."""

    __tablename__ = "slurm_node_hints"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node: Mapped[str] = mapped_column(String(256))
