"""The ledger collector reads the ledger at most once per cache period, whatever the
number of scrapes, and a ledger that cannot be read drops only its own series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy.exc import OperationalError

from app.core.records import NodeSpec, NodeTotals
from app.core.resources import Resources
from app.ledger.service import Ledger
from app.metrics.nodes import LedgerCollector
from app.metrics.registry import Metrics
from tests.metrics.scrape import parse

GIB = 2**30


class CountingLedger(Ledger):
    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger.db, ledger.clock)
        self.reads = 0
        self.broken = False

    def node_totals(self) -> list[NodeTotals]:
        self.reads += 1
        if self.broken:
            raise OperationalError("SELECT", {}, Exception("connection refused"))
        return super().node_totals()


def test_scrapes_within_the_cache_period_read_the_ledger_once(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    counting, clock = CountingLedger(ledger), [0.0]
    registry = CollectorRegistry()
    registry.register(
        LedgerCollector(counting.node_totals, cache_seconds=5, monotonic=lambda: clock[0])
    )
    for _ in range(10):
        generate_latest(registry)
    assert counting.reads == 1
    ledger.upsert_node("n2", NodeSpec(capacity=Resources(8000, 16 * GIB)))
    clock[0] = 4.9
    assert (
        parse(generate_latest(registry).decode()).value("nodeledger_nodes", state="admissible") == 1
    )
    clock[0] = 5.0
    assert (
        parse(generate_latest(registry).decode()).value("nodeledger_nodes", state="admissible") == 2
    )
    assert counting.reads == 2


def test_an_unreadable_ledger_drops_only_the_ledger_series(ledger: Ledger) -> None:
    counting = CountingLedger(ledger)
    counting.broken = True
    registry = CollectorRegistry()
    Metrics(registry)
    registry.register(LedgerCollector(counting.node_totals, cache_seconds=0))
    s = parse(generate_latest(registry).decode())
    assert "nodeledger_cluster_capacity" not in s.families
    assert s.value("nodeledger_build_info", version="0.1.0") == 1
