"""A node's Kubernetes headroom set as the ledger's admissions and pushes would leave it
(app.core.headroom), without a Slurm cluster: for the tests of where the headroom shows
(REST API, GenericNode, metrics, web page)."""

from __future__ import annotations

from datetime import datetime

from app.core.records import EventKind, NodeHeadroom
from app.core.resources import Resources
from app.ledger.events import EventDraft
from app.ledger.service import Ledger


def set_headroom(
    ledger: Ledger,
    node: str,
    *,
    target: Resources = Resources.ZERO,
    granted: Resources = Resources.ZERO,
    used_at: datetime | None = None,
) -> None:
    """Write the node's headroom with a HEADROOM event naming it, in one transaction, as
    every change of it is (followers of the event log read the node again)."""
    with ledger.store.write() as repo:
        row = repo.find_node(node, lock=True)
        assert row is not None, node
        repo.set_headroom(row.id, NodeHeadroom(target, granted, used_at))
        repo.insert_event(
            EventDraft(ledger.clock(), EventKind.HEADROOM, node, "headroom set by a test")
        )
