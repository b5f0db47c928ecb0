"""The ledger's operations against a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from app.core.ledger_errors import (
    AdmissionRejected,
    CapacityBelowHoldings,
    HolderConflict,
    HoldingNotFound,
    NodeInUse,
    NodeNotFound,
)
from app.core.records import EventKind, Holder, HolderKind, HoldingState, NodeSpec
from app.core.resources import Resources
from app.ledger.service import Ledger, SnapshotEntry

GiB = 2**30
POD = Holder(HolderKind.POD, "uid-1", "ns/p1")


def cpus(n: float, mem_gib: int = 0, gpus: int = 0) -> Resources:
    return Resources(int(n * 1000), mem_gib * GiB, gpus)


@pytest.fixture
def n1(ledger: Ledger) -> str:
    ledger.upsert_node("n1", NodeSpec(cpus(8, 16, 2), reserved=cpus(1, 1)))
    return "n1"


def test_admit_holds_and_release_frees(ledger: Ledger, n1: str) -> None:
    admission = ledger.admit(n1, POD, cpus(1.5, 2, 1))
    assert admission.created
    assert admission.holding.state is HoldingState.HELD
    assert ledger.get_node(n1).free == cpus(5.5, 13, 1)
    released = ledger.release(POD.id)
    assert released.holding.resources == cpus(1.5, 2, 1)
    assert ledger.get_node(n1).free == cpus(7, 15, 2)
    with pytest.raises(HoldingNotFound):
        ledger.release(POD.id)


def test_admit_is_idempotent_by_holder(ledger: Ledger, n1: str) -> None:
    first = ledger.admit(n1, POD, cpus(1))
    again = ledger.admit(n1, POD, cpus(1))
    assert not again.created
    assert again.holding == first.holding
    assert len(ledger.list_holdings(n1)) == 1


def test_same_holder_with_other_amounts_or_node_conflicts(ledger: Ledger, n1: str) -> None:
    ledger.upsert_node("n2", NodeSpec(cpus(8, 16)))
    ledger.admit(n1, POD, cpus(1))
    with pytest.raises(HolderConflict, match="already holds"):
        ledger.admit(n1, POD, cpus(2))
    with pytest.raises(HolderConflict, match="n1"):
        ledger.admit("n2", POD, cpus(1))


def test_rejection_names_each_short_resource_and_is_recorded(ledger: Ledger, n1: str) -> None:
    with pytest.raises(AdmissionRejected) as caught:
        ledger.admit(n1, POD, cpus(8, 1, 3))
    assert [s.resource for s in caught.value.shortfalls] == ["cpu", "gpu"]
    assert "cpu: requested 8, free 7" in caught.value.message
    assert "gpu: requested 3, free 2" in caught.value.message
    [event] = ledger.events(kind=EventKind.REJECTED)
    assert event.holder_id == POD.id
    assert event.message == caught.value.message
    assert ledger.list_holdings() == []


def test_unknown_node(ledger: Ledger) -> None:
    with pytest.raises(NodeNotFound):
        ledger.admit("nope", POD, cpus(1))
    with pytest.raises(NodeNotFound):
        ledger.get_node("nope")


def test_cordoned_or_unhealthy_node_admits_nothing(ledger: Ledger, n1: str) -> None:
    ledger.upsert_node(n1, NodeSpec(cpus(8, 16, 2)), cordon_reason="maintenance")
    with pytest.raises(AdmissionRejected, match="maintenance"):
        ledger.admit(n1, POD, cpus(1))
    ledger.upsert_node(n1, NodeSpec(cpus(8, 16, 2)))
    ledger.set_health(n1, "slurm state DRAIN")
    with pytest.raises(AdmissionRejected, match="DRAIN"):
        ledger.admit(n1, POD, cpus(1))
    ledger.set_health(n1, None)
    assert ledger.admit(n1, POD, cpus(1)).created
    kinds = [e.kind for e in ledger.events(node=n1)]
    assert kinds.count(EventKind.ADMISSIBILITY_CHANGED) == 4  # cordon and health, each twice


def test_capacity_cannot_shrink_below_holdings_unless_forced(ledger: Ledger, n1: str) -> None:
    ledger.admit(n1, POD, cpus(4))
    with pytest.raises(CapacityBelowHoldings, match="force"):
        ledger.upsert_node(n1, NodeSpec(cpus(4, 16), reserved=cpus(1)))
    view, created = ledger.upsert_node(n1, NodeSpec(cpus(4, 16), reserved=cpus(1)), force=True)
    assert not created
    assert not view.admissible
    assert "overcommitted" in (view.not_admissible_reason or "")
    assert ledger.events(kind=EventKind.CAPACITY_CHANGED)


def test_delete_node_refused_while_held(ledger: Ledger, n1: str) -> None:
    ledger.admit(n1, POD, cpus(1))
    with pytest.raises(NodeInUse):
        ledger.delete_node(n1)
    ledger.release(POD.id)
    ledger.delete_node(n1)
    assert ledger.list_nodes() == []
    assert ledger.events(kind=EventKind.NODE_DELETED)


def test_replace_holdings_records_what_came_and_went(ledger: Ledger, n1: str) -> None:
    ledger.admit(n1, POD, cpus(1))
    first = ledger.replace_holdings(
        n1,
        HolderKind.SLURM_JOB,
        {"10": SnapshotEntry("job-a", cpus(2, 1)), "11": SnapshotEntry("job-b", cpus(2, 1))},
    )
    assert first.added == ("10", "11")
    second = ledger.replace_holdings(
        n1,
        HolderKind.SLURM_JOB,
        {"11": SnapshotEntry("job-b", cpus(4, 1)), "12": SnapshotEntry("job-c", cpus(1))},
    )
    assert (second.added, second.removed, second.changed) == (("12",), ("10",), ("11",))
    assert ledger.replace_holdings(
        n1,
        HolderKind.SLURM_JOB,
        {"11": SnapshotEntry("job-b", cpus(4, 1)), "12": SnapshotEntry("job-c", cpus(1))},
    ).is_empty
    view = ledger.get_node(n1)
    assert view.held_by_slurm == cpus(5, 1)
    assert view.held_by_kubernetes == cpus(1)  # other kinds untouched
    events = ledger.events(kind=EventKind.HOLDINGS_REPLACED)
    assert [e.details["removed"] for e in events] == [[], ["10"]]


def test_a_slurm_job_may_span_nodes(ledger: Ledger, n1: str) -> None:
    ledger.upsert_node("n2", NodeSpec(cpus(8, 16)))
    for name in (n1, "n2"):
        ledger.replace_holdings(name, HolderKind.SLURM_JOB, {"7": SnapshotEntry("j", cpus(2))})
    assert len(ledger.list_holdings(kind=HolderKind.SLURM_JOB)) == 2


def test_pending_then_confirmed(ledger: Ledger, n1: str) -> None:
    pending = ledger.admit(n1, POD, cpus(1), state=HoldingState.PENDING)
    assert pending.holding.state is HoldingState.PENDING
    assert ledger.get_node(n1).free == cpus(6, 15, 2)  # pending counts as used
    assert ledger.confirm(HolderKind.POD, POD.id).state is HoldingState.HELD


def test_events_filter_and_page(ledger: Ledger, n1: str) -> None:
    ledger.admit(n1, POD, cpus(1))
    ledger.release(POD.id)
    everything = ledger.events()
    assert [e.kind for e in everything] == [
        EventKind.NODE_CREATED,
        EventKind.ADMITTED,
        EventKind.RELEASED,
    ]
    assert ledger.events(after_id=everything[0].id, limit=1)[0].kind is EventKind.ADMITTED
    assert ledger.events(since=everything[-1].at)[-1].kind is EventKind.RELEASED
    assert ledger.events(node="other") == []


def test_record_keeps_the_truth_even_when_it_overcommits(ledger: Ledger) -> None:
    ledger.upsert_node("r1", NodeSpec(capacity=Resources(2000, 2**30)))
    pod = Holder(HolderKind.POD, "uid-r", "ns/bound-elsewhere")
    first = ledger.record("r1", pod, Resources(3000, 2**29), reason="bound by default-scheduler")
    assert first.created
    view = ledger.get_node("r1")
    assert view.free.cpu_millis == -1000
    assert view.not_admissible_reason is not None
    assert not ledger.record("r1", pod, Resources(3000, 2**29), reason="again").created
    resized = ledger.record("r1", pod, Resources(1000, 2**29), reason="resized in place")
    assert resized.created
    assert [h.resources.cpu_millis for h in ledger.list_holdings()] == [1000]
