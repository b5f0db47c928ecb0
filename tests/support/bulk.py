"""Thousands of nodes with their pods in seconds: rows written in bulk, straight through
SQLAlchemy, as the ledger would have written them one admission at a time (an event per
node and per holding included). For the scale test and bench/ledger_scale."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, insert, select

from app.db.engine import create_db_engine
from app.ledger.tables import EventRow, HoldingRow, NodeRow

GIB = 2**30
NODE_CPU_MILLIS = 64_000
BATCH = 5000
NODES = cast(Table, NodeRow.__table__)
HOLDINGS = cast(Table, HoldingRow.__table__)
EVENTS = cast(Table, EventRow.__table__)


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def pod_cpu_millis(i: int) -> int:
    """Each pod on node i: 1-6 cores, so 10 pods hold 10-60 of the 64 cores."""
    return 1000 * (1 + i % 6)


def health_reason(i: int) -> str | None:
    """One node in 50 is drained."""
    return f"Slurm node {node_name(i)} is DRAIN" if i % 50 == 49 else None


def fill(database_url: str, nodes: int, pods_per_node: int = 10) -> None:
    """``nodes`` nodes of 64 cores, 256 GiB and 8 GPUs, each with ``pods_per_node`` pods."""
    now = datetime.now(UTC)
    engine = create_db_engine(database_url)
    try:
        with engine.begin() as connection:
            _insert(connection, NODES, [_node(i, now) for i in range(nodes)])
            ids = dict(connection.execute(select(NODES.c.name, NODES.c.id)).all())
            holdings, events = [], [_event(node_name(i), "node_created", now) for i in range(nodes)]
            for i in range(nodes):
                for j in range(pods_per_node):
                    uid = f"{i:05d}-{j:02d}-bulk-pod"
                    holdings.append(_holding(ids[node_name(i)], uid, pod_cpu_millis(i), now))
                    events.append(
                        {**_event(node_name(i), "admitted", now), "holder_kind": "pod",
                         "holder_id": uid, "cpu_millis": pod_cpu_millis(i)}
                    )  # fmt: skip
            _insert(connection, HOLDINGS, holdings)
            _insert(connection, EVENTS, events)
    finally:
        engine.dispose()


def _insert(connection: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    for start in range(0, len(rows), BATCH):
        connection.execute(insert(table), rows[start : start + BATCH])


def _node(i: int, now: datetime) -> dict[str, Any]:
    return {
        "name": node_name(i), "slurm_name": None,
        "cpu_millis": NODE_CPU_MILLIS, "memory_bytes": 256 * GIB, "gpus": 8,
        "reserved_cpu_millis": 0, "reserved_memory_bytes": 0, "reserved_gpus": 0,
        "labels": {"rack": f"r{i // 40}"}, "cordon_reason": None,
        "health_reason": health_reason(i), "created_at": now, "updated_at": now,
    }  # fmt: skip


def _holding(node_id: int, uid: str, cpu_millis: int, now: datetime) -> dict[str, Any]:
    return {
        "node_id": node_id, "holder_kind": "pod", "holder_id": uid,
        "display_name": f"bulk/{uid}", "cpu_millis": cpu_millis, "memory_bytes": 4 * GIB,
        "gpus": 0, "state": "held", "created_at": now, "updated_at": now,
    }  # fmt: skip


def _event(node: str, kind: str, now: datetime) -> dict[str, Any]:
    return {
        "at": now, "kind": kind, "node": node, "holder_kind": None, "holder_id": None,
        "cpu_millis": None, "memory_bytes": None, "gpus": None, "message": kind,
        "details": {},
    }  # fmt: skip
