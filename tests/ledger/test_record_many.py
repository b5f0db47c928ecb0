"""Recording many holdings that exist outside the ledger in one transaction (a pod
resync): the same result and events as one record() each (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from app.core.records import EventKind, Holder, HolderKind, NodeSpec, Recording
from app.core.resources import Resources
from app.ledger.service import Ledger

GIB = 2**30


def pod(uid: str, node: str, cpu: int = 1000) -> Recording:
    return Recording(node, Holder(HolderKind.POD, uid, f"ns/{uid}"), Resources(cpu, GIB))


@pytest.fixture
def nodes(ledger: Ledger) -> Ledger:
    for name in ("n1", "n2"):
        ledger.upsert_node(name, NodeSpec(capacity=Resources(4000, 8 * GIB)))
    return ledger


def held(ledger: Ledger) -> dict[str, tuple[str, int]]:
    return {
        h.holder.id: (h.node, h.resources.cpu_millis)
        for h in ledger.list_holdings(kind=HolderKind.POD)
    }


def recorded_events(ledger: Ledger, after: int) -> list[tuple[str | None, str | None]]:
    return [
        (e.node, e.holder_id)
        for e in ledger.events(after_id=after, limit=100)
        if e.kind is EventKind.ADMITTED and e.details.get("recorded")
    ]


def test_records_what_is_missing_or_different_and_nothing_else(nodes: Ledger) -> None:
    ledger = nodes
    ledger.record("n1", pod("same", "n1").holder, Resources(1000, GIB), reason="bound pod")
    ledger.record("n1", pod("moved", "n1").holder, Resources(1000, GIB), reason="bound pod")
    mark = ledger.last_event_id()
    entries = [
        pod("same", "n1"), pod("moved", "n2"), pod("new", "n2", 500),
        pod("lost", "gone"), pod("big", "n1", 9000),  # overcommits n1: recorded anyway
    ]  # fmt: skip
    result = ledger.record_many(entries, reason="bound pod")
    assert result.changed == {"n1", "n2"}
    assert [e.holder.id for e in result.unknown_node] == ["lost"]
    assert held(ledger) == {
        "same": ("n1", 1000), "moved": ("n2", 1000), "new": ("n2", 500), "big": ("n1", 9000)
    }  # fmt: skip
    assert recorded_events(ledger, mark) == [("n2", "moved"), ("n2", "new"), ("n1", "big")]
    # The node it left has an event of its own (the status mirror follows events by node).
    released = [e for e in ledger.events(after_id=mark, limit=100) if e.kind is EventKind.RELEASED]
    assert [(e.node, e.holder_id, e.message) for e in released] == [
        ("n1", "moved", "moved to node 'n2': bound pod")
    ]
    assert ledger.get_node("n1").not_admissible_reason is not None  # overcommitted
    mark = ledger.last_event_id()
    again = ledger.record_many(entries, reason="bound pod")
    assert again.changed == frozenset()
    assert recorded_events(ledger, mark) == []


def test_a_holder_admitted_meanwhile_falls_back_to_one_by_one(
    nodes: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = nodes

    def raced(*args: object) -> object:
        raise IntegrityError("INSERT", {}, Exception("duplicate key"))

    monkeypatch.setattr(ledger, "_record_many", raced)
    ledger.admit("n1", Holder(HolderKind.POD, "a"), Resources(1000, GIB))
    result = ledger.record_many([pod("a", "n1"), pod("b", "n2"), pod("c", "x")], reason="r")
    assert result.changed == {"n2"}
    assert [e.holder.id for e in result.unknown_node] == ["c"]
    assert held(ledger) == {"a": ("n1", 1000), "b": ("n2", 1000)}
