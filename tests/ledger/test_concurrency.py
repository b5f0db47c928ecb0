"""Racing admissions on a real database: the last CPU goes to exactly one caller."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from app.core.ledger_errors import AdmissionRejected
from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.ledger.service import Ledger

ONE_CPU = Resources(1000, 2**20, 0)


def test_64_racing_admissions_of_one_cpu_on_8_admit_exactly_8(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(Resources(8000, 2**30, 0)))

    def admit(i: int) -> bool:
        try:
            ledger.admit("n1", Holder(HolderKind.POD, f"uid-{i}"), ONE_CPU)
        except AdmissionRejected:
            return False
        return True

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(admit, range(64)))
    assert sum(results) == 8
    view = ledger.get_node("n1")
    assert len(view.holdings) == 8
    assert view.free.cpu_millis == 0


def test_same_holder_admitted_concurrently_yields_one_holding(ledger: Ledger) -> None:
    for name in ("n1", "n2"):
        ledger.upsert_node(name, NodeSpec(Resources(8000, 2**30, 0)))
    holder = Holder(HolderKind.POD, "the-uid")

    def admit(i: int) -> str:
        try:
            ledger.admit("n1" if i % 2 else "n2", holder, ONE_CPU)
        except Exception as exc:  # conflicts on the other node are expected
            return type(exc).__name__
        return "ok"

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(admit, range(32)))
    assert len(ledger.list_holdings()) == 1
    assert set(outcomes) <= {"ok", "HolderConflict"}
    assert ledger.get_node("n1").held.cpu_millis + ledger.get_node("n2").held.cpu_millis == 1000
