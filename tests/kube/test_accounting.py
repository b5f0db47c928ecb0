"""Pod accounting against a real ledger: a resync writes only what the ledger does not
already have, and sweeps release holdings whose pod is not bound, once past the grace."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from app.admission.service import Admissions
from app.core.pods import PodInfo
from app.core.records import EventKind, Holder, HolderKind, NodeSpec, Recorded, Recording
from app.core.resources import Resources
from app.db.engine import Database
from app.kube.controllers.accounting import RECORD_BATCH, PodAccounting
from app.ledger.service import Ledger

GIB = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(database: Database, clock: Clock) -> Ledger:
    ledger = Ledger(database, clock=clock)
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    return ledger


@pytest.fixture
def accounting(ledger: Ledger, clock: Clock) -> PodAccounting:
    return PodAccounting(
        Admissions(ledger), {"n1"}.__contains__, gpu_resource="nvidia.com/gpu",
        binding_grace=30, clock=clock,
    )  # fmt: skip


def pod(uid: str, cpu: int = 1000, node: str | None = "n1", phase: str = "Pending") -> PodInfo:
    return PodInfo(uid, "ns", uid, node, phase, Resources(cpu, GIB))


def pod_holdings(ledger: Ledger) -> dict[str, int]:
    return {h.holder.id: h.resources.cpu_millis for h in ledger.list_holdings(kind=HolderKind.POD)}


def writes_since(ledger: Ledger, event_id: int) -> list[str]:
    """Holders whose holding an event after ``event_id`` recorded or released."""
    kinds = {EventKind.ADMITTED, EventKind.RELEASED}
    return [
        f"{e.kind.value} {e.holder_id}"
        for e in ledger.events(after_id=event_id, limit=1000)
        if e.kind in kinds
    ]


def test_a_resync_records_only_what_the_ledger_does_not_have(
    ledger: Ledger, accounting: PodAccounting
) -> None:
    accounting.resync([pod("same"), pod("resized"), pod("elsewhere", node="other")])
    mark = ledger.last_event_id()
    accounting.resync([pod("same"), pod("resized", cpu=2000), pod("new")])
    assert writes_since(ledger, mark) == ["admitted resized", "admitted new"]
    assert pod_holdings(ledger) == {"same": 1000, "resized": 2000, "new": 1000}
    mark = ledger.last_event_id()
    accounting.resync([pod("same"), pod("resized", cpu=2000), pod("new")])
    assert writes_since(ledger, mark) == []  # nothing changed: no transaction at all


def test_sweeps_release_unbound_holdings_once_past_the_grace(
    ledger: Ledger, accounting: PodAccounting, clock: Clock
) -> None:
    admissions = accounting.admissions
    admissions.admit("n1", Holder(HolderKind.POD, "gone"), Resources(1000, GIB))
    clock.advance(60)
    admissions.admit("n1", Holder(HolderKind.POD, "admitted"), Resources(1000, GIB))
    accounting.resync([pod("bound")])
    # The holding of a pod that is not there went; the fresh admission waits for its pod.
    assert set(pod_holdings(ledger)) == {"bound", "admitted"}
    clock.advance(20)
    accounting.sweep()
    assert set(pod_holdings(ledger)) == {"bound", "admitted"}
    clock.advance(20)  # 40 s old: its pod was never bound
    accounting.sweep()
    assert set(pod_holdings(ledger)) == {"bound"}


def test_a_holding_whose_pod_was_bound_in_time_is_kept(
    ledger: Ledger, accounting: PodAccounting, clock: Clock
) -> None:
    accounting.resync([])
    accounting.admissions.admit("n1", Holder(HolderKind.POD, "p"), Resources(1000, GIB))
    clock.advance(5)
    accounting.on_event("ADDED", pod("p"))  # the scheduler bound it
    clock.advance(60)
    accounting.sweep()
    assert set(pod_holdings(ledger)) == {"p"}
    accounting.on_event("MODIFIED", pod("p", phase="Succeeded"))
    assert pod_holdings(ledger) == {}


def test_no_sweep_before_the_first_resync(
    ledger: Ledger, accounting: PodAccounting, clock: Clock
) -> None:
    accounting.admissions.admit("n1", Holder(HolderKind.POD, "p"), Resources(1000, GIB))
    clock.advance(60)
    accounting.sweep()  # the pods are not listed yet: "not bound" would be a guess
    assert set(pod_holdings(ledger)) == {"p"}


def test_a_cold_resync_records_in_batches(
    ledger: Ledger, accounting: PodAccounting, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    record_many = ledger.record_many

    def counted(entries: Sequence[Recording], *, reason: str) -> Recorded:
        calls.append(len(entries))
        return record_many(entries, reason=reason)

    monkeypatch.setattr(ledger, "record_many", counted)
    accounting.resync([pod(f"p{i}", cpu=10) for i in range(1200)])
    assert calls == [RECORD_BATCH, RECORD_BATCH, 1200 - 2 * RECORD_BATCH]
    assert len(pod_holdings(ledger)) == 1200
