"""What one admission, confirmation, release, single-node read or snapshot refresh costs
does not grow with the number of nodes: none of their statements reads a whole table
(each one's plan, asked of the database itself, finds its rows through an index)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from app.core.ledger_errors import AdmissionRejected
from app.core.records import HeldDevice, Holder, HolderKind, HoldingState, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger

GIB = 2**30
POD = Holder(HolderKind.POD, "uid-1", "ns/p1")
MANUAL = Holder(HolderKind.MANUAL, "ops-1")
CPU = Resources(1000, GIB)


@contextmanager
def statements(db: Database) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def record(_c: Any, _cursor: Any, statement: str, params: Any, _ctx: Any, _many: Any) -> None:
        seen.append((statement, params))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def full_scans(db: Database, statement: str, params: Any) -> list[str]:
    """The plan's steps that read a whole table."""
    with db.engine.connect() as connection:
        if db.is_sqlite:
            plan = [
                row[3]
                for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
            ]
            return [step for step in plan if step.startswith("SCAN ")]
        # On a handful of rows a sequential scan is cheapest: ask for the plan that the
        # planner would take if it could avoid one, and see whether it can.
        connection.exec_driver_sql("SET enable_seqscan = off")
        plan = [row[0] for row in connection.exec_driver_sql(f"EXPLAIN {statement}", params)]
        return [step for step in plan if "Seq Scan" in step]


def _reject(ledger: Ledger) -> None:
    with pytest.raises(AdmissionRejected):
        ledger.admit("a", Holder(HolderKind.POD, "too-big"), Resources(64_000))


OPERATIONS: dict[str, Callable[[Ledger], object]] = {
    "admit pending": lambda ledger: ledger.admit("a", POD, CPU, state=HoldingState.PENDING),
    "admit again": lambda ledger: ledger.admit("a", POD, CPU, state=HoldingState.PENDING),
    "confirm": lambda ledger: ledger.confirm(HolderKind.POD, POD.id),
    "rejected": _reject,
    "get node": lambda ledger: ledger.get_node("a"),
    "views named (a snapshot's refresh)": lambda ledger: ledger.views_named(["a", "b"]),
    "poll the log": lambda ledger: ledger.events_after(ledger.last_event_id() - 1, 500),
    "release": lambda ledger: ledger.release(POD.id, HolderKind.POD),
    "admit manual": lambda ledger: ledger.admit("a", MANUAL, CPU),
    "release either kind": lambda ledger: ledger.release(MANUAL.id),
    "record": lambda ledger: ledger.record("a", POD, CPU, reason="bound elsewhere"),
    "admit with GPU devices": lambda ledger: ledger.admit(
        "a", Holder(HolderKind.POD, "uid-gpu"), Resources(1000, GIB, 1), devices=(HeldDevice(1),)
    ),
    "confirm with a hold job": lambda ledger: ledger.confirm(
        HolderKind.POD, "uid-gpu", slurm_hold="42"
    ),
}


def test_hot_paths_never_read_a_whole_table(database: Database) -> None:
    ledger = Ledger(database)
    for name in ("a", "b"):
        ledger.upsert_node(name, NodeSpec(Resources(8000, 16 * GIB, 2)))
    for name, operation in OPERATIONS.items():
        with statements(database) as seen:
            operation(ledger)
        for statement, params in seen:
            if statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
                assert full_scans(database, statement, params) == [], (name, statement)
