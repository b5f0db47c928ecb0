"""A refusal has one shape whoever refused: the ledger (no room) or the gate (Slurm), so
that the event log, read by holder, shows both (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from app.admission.service import AdmissionRequest, Admissions
from app.core.ledger_errors import AdmissionRejected
from app.core.records import EventKind, Holder, HolderKind, Holding, NodeSpec
from app.core.resources import Resources
from app.ledger.service import Ledger

NODE = "n1"
POD = Holder(HolderKind.POD, "uid-1", "ns/p1")
SMALL = Resources(1000, 2**30, 0)
LARGE = Resources(16_000, 2**30, 0)  # more than the node has


class _RefusingGate:
    def confirm(self, holding: Holding) -> str | None:
        raise AdmissionRejected("Slurm node n1 is DRAIN: maintenance")

    def changed(self, node: str) -> None:
        """Nothing to tell."""

    def headroom_open(self, node: str) -> bool:
        return False

    def released(self, holding: Holding) -> None:
        """No hold job."""

    def defer_push(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        """No headroom."""


def test_a_gate_rejection_and_a_ledger_rejection_are_found_by_holder(ledger: Ledger) -> None:
    ledger.upsert_node(NODE, NodeSpec(Resources(8000, 16 * 2**30, 0)))
    admissions = Admissions(ledger, _RefusingGate())
    with pytest.raises(AdmissionRejected, match="DRAIN"):
        admissions.admit(
            AdmissionRequest(NODE, POD, SMALL)
        )  # held by the ledger, refused by the gate
    with pytest.raises(AdmissionRejected, match="cpu"):
        admissions.admit(AdmissionRequest(NODE, POD, LARGE))  # refused by the ledger
    rejections = ledger.events(kind=EventKind.REJECTED)
    by_holder = [e for e in rejections if e.holder_id == POD.id]
    assert len(by_holder) == len(rejections) == 2
    gate, own = sorted(by_holder, key=lambda e: e.id)
    assert gate.message == "Slurm node n1 is DRAIN: maintenance"
    assert "cpu: requested 16" in own.message
    for event, requested in ((gate, SMALL), (own, LARGE)):
        assert (event.node, event.holder_kind, event.resources) == (NODE, POD.kind, requested)
    assert ledger.list_holdings() == []
