"""Events drafted for what happened outside the ledger (app.ledger.events): their texts."""

from __future__ import annotations

from datetime import UTC, datetime

from app.core.records import EventKind
from app.ledger import events

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LOWERED = "k8scpu:14,k8smemory:30976"


def test_the_drift_event_names_the_node_and_what_was_pushed() -> None:
    event = events.slurm_drift(T0, "n1", "n1", LOWERED)
    assert event.kind is EventKind.SLURM_DRIFT
    assert event.message == (
        "Slurm node n1 lost the pushed counts (slurmctld restart or reconfigure?); "
        f"pushed {LOWERED} again"
    )
    assert event.details == {"pushed": LOWERED}
