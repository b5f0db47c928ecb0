"""The ledger collector reads the ledger at most once per cache period, whatever the
number of scrapes, and a ledger that cannot be read drops only its own series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy.exc import OperationalError

from app.core.records import HeldDevice, Holder, HolderKind, HoldingState, NodeSpec, NodeTotals
from app.core.resources import Resources
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.metrics.nodes import LedgerCollector
from app.metrics.registry import Metrics
from tests.metrics.scrape import parse
from tests.support.headroom import set_headroom

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


def test_the_snapshot_and_the_database_give_the_same_headroom_gauges(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32 * GIB, 2)))
    ledger.upsert_node("n2", NodeSpec(capacity=Resources(8000, 16 * GIB)))
    ledger.admit("n1", Holder(HolderKind.POD, "p1"), Resources(500, GIB, 1))
    set_headroom(ledger, "n1", target=Resources(1000, GIB, 1), granted=Resources(1500, 2 * GIB, 2))
    snapshot = NodeSnapshot(ledger)
    for read in (ledger.node_totals, snapshot.list_nodes):
        registry = CollectorRegistry()
        registry.register(LedgerCollector(read, cache_seconds=0))
        s = parse(generate_latest(registry).decode())
        assert s.value("nodeledger_node_headroom_target", node="n1", resource="gpu") == 1
        assert s.value("nodeledger_node_headroom_granted", node="n1", resource="cpu") == 1.5
        assert s.value("nodeledger_node_headroom_target", node="n2", resource="cpu") == 0
        assert s.value("nodeledger_cluster_headroom_free", resource="cpu") == 1
        assert s.value("nodeledger_cluster_headroom_free", resource="memory") == GIB
        assert s.value("nodeledger_cluster_headroom_free", resource="gpu") == 1
    # Without the per-node series the cluster's headroom stays.
    registry = CollectorRegistry()
    registry.register(LedgerCollector(ledger.node_totals, per_node=False, cache_seconds=0))
    s = parse(generate_latest(registry).decode())
    assert "nodeledger_node_headroom_target" not in s.families
    assert s.value("nodeledger_cluster_headroom_target", resource="memory") == GIB


def test_which_holder_has_which_gpu_device_is_a_series_per_device(ledger: Ledger) -> None:
    """Issue 23: 1 per device held by identity, labelled with its holder (not its UUID: the
    labels stay as they were); none for GPUs held by count, and none from the database's
    totals, which carry no holdings."""
    ledger.upsert_node("g1", NodeSpec(capacity=Resources(16000, 32 * GIB, 4)))
    pod = Holder(HolderKind.POD, "uid-1", "ml/trainer-0")
    ledger.admit(
        "g1",
        pod,
        Resources(1000, GIB, 2),
        devices=(HeldDevice(0, "GPU-0"), HeldDevice(2, "GPU-2")),
        state=HoldingState.PENDING,
    )
    ledger.confirm(HolderKind.POD, pod.id, slurm_hold="77")
    ledger.admit("g1", Holder(HolderKind.MANUAL, "ops"), Resources(0, 0, 1))  # counted only
    registry = CollectorRegistry()
    registry.register(LedgerCollector(NodeSnapshot(ledger).list_nodes, cache_seconds=0))
    s = parse(generate_latest(registry).decode())
    labels = {"node": "g1", "holder_kind": "pod", "holder": "ml/trainer-0"}
    assert s.series("nodeledger_node_gpu_device_holder") == {
        frozenset({**labels, "device": device}.items()): 1.0 for device in ("0", "2")
    }
    totals = CollectorRegistry()
    totals.register(LedgerCollector(ledger.node_totals, cache_seconds=0))
    assert parse(generate_latest(totals).decode()).series("nodeledger_node_gpu_device_holder") == {}
