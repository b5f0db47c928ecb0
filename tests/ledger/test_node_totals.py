"""Node totals (holdings summed by kind in the database) give the same figures as the
full node views, which load every holding (SQLite and PostgreSQL)."""

from __future__ import annotations

from app.core.records import Holder, HolderKind, NodeSpec, Recording
from app.core.resources import Resources
from app.ledger.service import Ledger, SnapshotEntry

GIB = 2**30


def test_totals_match_the_views(ledger: Ledger) -> None:
    ledger.upsert_node("a", NodeSpec(Resources(8000, 16 * GIB, 2), reserved=Resources(500, GIB)))
    ledger.upsert_node("b", NodeSpec(Resources(4000, 8 * GIB)), cordon_reason="maintenance")
    ledger.upsert_node("idle", NodeSpec(Resources(4000, 8 * GIB)))
    ledger.admit("a", Holder(HolderKind.POD, "p1"), Resources(1500, 2 * GIB, 1))
    ledger.admit("a", Holder(HolderKind.MANUAL, "m1"), Resources(500, GIB))
    ledger.record_many(
        [Recording("b", Holder(HolderKind.POD, "p2"), Resources(6000, GIB))], reason="bound"
    )  # overcommits b
    ledger.replace_holdings(
        "a", HolderKind.SLURM_JOB, {"j1": SnapshotEntry("j1", Resources(3000, 4 * GIB))}
    )
    views = {v.name: v for v in ledger.list_nodes()}
    totals = {t.name: t for t in ledger.node_totals()}
    assert list(totals) == ["a", "b", "idle"]
    for name, view in views.items():
        t = totals[name]
        figures = (t.allocatable, t.held_by_kubernetes, t.held_by_slurm, t.free)
        assert figures == (view.allocatable, view.held_by_kubernetes, view.held_by_slurm, view.free)
        assert t.not_admissible_reason == view.not_admissible_reason
    assert totals["b"].not_admissible_reason is not None
    assert totals["idle"].free == Resources(4000, 8 * GIB)
