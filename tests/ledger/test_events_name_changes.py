"""Every change to a node's view records an event naming that node: followers of the log
(app.ledger.snapshot, the GenericNode mirror) see changes only that way."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.core.ledger_errors import AdmissionRejected
from app.core.records import Holder, HolderKind, HoldingState, NodeSpec, NodeView
from app.core.resources import Resources
from app.ledger.service import Ledger, SnapshotEntry

GIB = 2**30
SPEC = NodeSpec(Resources(8000, 16 * GIB, 2))
POD = Holder(HolderKind.POD, "uid-1", "ns/p1")
CPU = Resources(1000, GIB)


def _reject(ledger: Ledger) -> None:
    with pytest.raises(AdmissionRejected):
        ledger.admit("a", POD, Resources(64_000))


MUTATIONS: dict[str, Callable[[Ledger], object]] = {
    "create node": lambda ledger: ledger.upsert_node("c", SPEC),
    "change capacity": lambda ledger: ledger.upsert_node("a", NodeSpec(Resources(16_000, GIB))),
    "cordon only": lambda ledger: ledger.upsert_node("a", SPEC, cordon_reason="maintenance"),
    "same spec again": lambda ledger: ledger.upsert_node("a", SPEC),
    "delete node": lambda ledger: ledger.delete_node("b"),
    "health": lambda ledger: ledger.set_health("a", "Slurm node a is DRAIN"),
    "admit": lambda ledger: ledger.admit("a", POD, CPU),
    "admit pending": lambda ledger: ledger.admit("a", POD, CPU, state=HoldingState.PENDING),
    "rejected": _reject,
    "record": lambda ledger: ledger.record("a", POD, CPU, reason="bound elsewhere"),
    "replace slurm jobs": lambda ledger: ledger.replace_holdings(
        "a", HolderKind.SLURM_JOB, {"7": SnapshotEntry("job", CPU)}
    ),
}
# Mutations of a holding that exists first: (setup, change)
ON_A_HOLDING: dict[str, Callable[[Ledger], object]] = {
    "release": lambda ledger: ledger.release(POD.id),
    "confirm": lambda ledger: ledger.confirm(HolderKind.POD, POD.id),
    "record resized": lambda ledger: ledger.record("a", POD, CPU + CPU, reason="resized"),
    "record moved": lambda ledger: ledger.record("b", POD, CPU, reason="bound to b"),
}


def views(ledger: Ledger) -> dict[str, NodeView]:
    return {v.name: v for v in ledger.list_nodes()}


def changed_nodes(before: dict[str, NodeView], after: dict[str, NodeView]) -> set[str]:
    return {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}


def assert_events_name_every_change(ledger: Ledger, change: Callable[[Ledger], object]) -> None:
    before, last = views(ledger), ledger.last_event_id()
    change(ledger)
    named = {e.node for e in ledger.events(after_id=last, limit=1000)}
    assert changed_nodes(before, views(ledger)) <= named


@pytest.fixture
def two_nodes(ledger: Ledger) -> Ledger:
    for name in ("a", "b"):
        ledger.upsert_node(name, SPEC)
    return ledger


@pytest.mark.parametrize("change", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_a_change_names_its_node(two_nodes: Ledger, change: Callable[[Ledger], object]) -> None:
    assert_events_name_every_change(two_nodes, change)


@pytest.mark.parametrize("change", ON_A_HOLDING.values(), ids=ON_A_HOLDING.keys())
def test_a_holding_change_names_its_nodes(
    two_nodes: Ledger, change: Callable[[Ledger], object]
) -> None:
    two_nodes.admit("a", POD, CPU, state=HoldingState.PENDING)
    assert_events_name_every_change(two_nodes, change)
