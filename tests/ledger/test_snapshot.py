"""The in-memory node snapshot equals what the ledger reads, after every kind of change,
made by this process or by another replica, committed in id order or not."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from app.core.records import EventKind, Holder, HolderKind, HoldingState, NodeSpec, NodeView
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.events import EventDraft
from app.ledger.service import Ledger, SnapshotEntry
from app.ledger.snapshot import COMPACT_AFTER, NodeSnapshot, Views
from app.ledger.statements import HOLDINGS, LedgerStatements
from app.ledger.tables import NodeRow
from tests.support.realenv import wait_until

GIB = 2**30
SPEC = NodeSpec(Resources(8000, 16 * GIB, 2))
CPU = Resources(1000, GIB)


def pod(uid: str) -> Holder:
    return Holder(HolderKind.POD, uid, f"ns/{uid}")


def as_read(ledger: Ledger) -> dict[str, NodeView]:
    return {v.name: v for v in ledger.list_nodes()}


class CountingLedger(Ledger):
    """Remembers which nodes each refresh read again."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.reads: list[set[str]] = []

    def views_named(self, names: Collection[str]) -> list[NodeView]:
        self.reads.append(set(names))
        return super().views_named(names)


@pytest.fixture
def counting(database: Database) -> CountingLedger:
    ledger = CountingLedger(database)
    for name in ("a", "b", "c"):
        ledger.upsert_node(name, SPEC)
    return ledger


STEPS: dict[str, Callable[[Ledger], object]] = {
    "admit": lambda ledger: ledger.admit("a", pod("p1"), CPU),
    "admit pending": lambda ledger: ledger.admit("b", pod("p2"), CPU, state=HoldingState.PENDING),
    "confirm": lambda ledger: ledger.confirm(HolderKind.POD, "p2"),
    "record": lambda ledger: ledger.record("c", pod("p3"), CPU + CPU, reason="bound elsewhere"),
    "record moved": lambda ledger: ledger.record("a", pod("p3"), CPU, reason="moved"),
    "release": lambda ledger: ledger.release("p1"),
    "slurm jobs": lambda ledger: ledger.replace_holdings(
        "b", HolderKind.SLURM_JOB, {"7": SnapshotEntry("job", CPU)}
    ),
    "health": lambda ledger: ledger.set_health("b", "Slurm node b is DRAIN"),
    "cordon": lambda ledger: ledger.upsert_node("c", SPEC, cordon_reason="maintenance"),
    "capacity": lambda ledger: ledger.upsert_node("c", NodeSpec(Resources(4000, GIB))),
    "new node": lambda ledger: ledger.upsert_node("d", SPEC),
    "delete node": lambda ledger: ledger.delete_node("d"),
}


def test_follows_every_kind_of_change_reading_only_the_changed_nodes(
    counting: CountingLedger,
) -> None:
    snapshot = NodeSnapshot(counting)
    assert snapshot.views() == as_read(counting)
    for name, step in STEPS.items():
        counting.reads.clear()
        last = counting.last_event_id()
        step(counting)
        assert snapshot.views() == as_read(counting), name
        named = {e.node for e in counting.events(after_id=last)}
        assert counting.reads == [named], name
    assert "d" not in snapshot.views()
    nodes = snapshot.list_nodes()
    assert list(nodes) == counting.list_nodes()
    assert snapshot.list_nodes() is nodes  # the same while no node changed (app.slurm.sync)


def test_subscribers_hear_which_nodes_changed(counting: CountingLedger) -> None:
    snapshot = NodeSnapshot(counting)
    heard: list[frozenset[str]] = []
    unsubscribe = snapshot.subscribe(heard.append)
    snapshot.views()
    assert heard == [frozenset({"a", "b", "c"})]  # the first load: every node
    for name, step in STEPS.items():
        heard.clear()
        last = counting.last_event_id()
        step(counting)
        views = snapshot.views()
        named = {e.node for e in counting.events(after_id=last)}
        assert heard == [frozenset(named)], name
    heard.clear()
    counting.record_event(EventKind.SLURM_PUSHED, "a", "pushed")  # says nothing changed
    snapshot.views()
    assert heard == []
    # A full reload tells only what differs from what the subscribers last heard.
    snapshot.reload()
    assert heard == []
    counting.admit("a", pod("p9"), CPU)
    snapshot.reload()
    assert heard == [frozenset({"a"})]
    assert views["a"] != snapshot.views()["a"]
    unsubscribe()
    counting.release("p9")
    snapshot.views()
    assert heard == [frozenset({"a"})]


def test_a_failing_subscriber_does_not_stop_the_others(counting: CountingLedger) -> None:
    snapshot = NodeSnapshot(counting)
    heard: list[frozenset[str]] = []

    def broken(names: frozenset[str]) -> None:
        raise RuntimeError("subscriber bug")

    snapshot.subscribe(broken)
    snapshot.subscribe(heard.append)
    snapshot.views()
    counting.admit("b", pod("p1"), CPU)
    assert snapshot.views()["b"].held == CPU
    assert heard[-1] == frozenset({"b"})


def test_a_change_by_another_replica_shows_on_the_next_read(
    database_url: str, counting: CountingLedger
) -> None:
    snapshot = NodeSnapshot(counting)
    snapshot.views()
    other_db = Database.from_url(database_url)
    try:
        other = Ledger(other_db)
        other.admit("b", pod("elsewhere"), CPU)
        other.set_health("c", "Slurm node c is DOWN")
        views = snapshot.views()
        assert views["b"].held_by_kubernetes == CPU
        assert views["c"].health_reason == "Slurm node c is DOWN"
        assert views == as_read(counting)
    finally:
        other_db.dispose()


def test_nothing_changed_reads_no_node(counting: CountingLedger) -> None:
    snapshot = NodeSnapshot(counting)
    snapshot.views()
    counting.record_event(EventKind.SLURM_PUSHED, "a", "pushed")  # says nothing changed
    snapshot.views()
    snapshot.views()
    assert counting.reads == []


def test_max_age_answers_from_memory_but_always_sees_this_process_writes(
    database_url: str, counting: CountingLedger
) -> None:
    now = [0.0]
    snapshot = NodeSnapshot(counting, monotonic=lambda: now[0])
    snapshot.views()
    other_db = Database.from_url(database_url)  # another replica
    try:
        Ledger(other_db).admit("a", pod("elsewhere"), CPU)
        now[0] = 0.05
        assert snapshot.views(max_age=0.1)["a"].held == Resources.ZERO  # not older than asked
        now[0] = 0.2
        assert snapshot.views(max_age=0.1)["a"].held == CPU
        counting.admit("b", pod("here"), CPU)  # this process: seen at once
        assert snapshot.views(max_age=60)["b"].held == CPU
        Ledger(other_db).admit("c", pod("elsewhere-2"), CPU)
        assert snapshot.views(max_age=60)["c"].held == Resources.ZERO
        now[0] = 0.3
        assert snapshot.views(max_age=0)["c"].held == CPU
    finally:
        other_db.dispose()


def test_a_change_without_an_event_lasts_until_the_next_full_reload(
    database: Database, counting: CountingLedger
) -> None:
    snapshot = NodeSnapshot(counting)
    snapshot.views()
    with database.write() as session:  # what no ledger operation does: no event
        session.execute(update(NodeRow).where(NodeRow.name == "a").values(cpu_millis=2000))
    assert snapshot.views()["a"].spec.capacity.cpu_millis == 8000
    snapshot.reload()
    assert snapshot.views()["a"].spec.capacity.cpu_millis == 2000


def test_a_failed_refresh_loads_everything_next_time(counting: CountingLedger) -> None:
    snapshot = NodeSnapshot(counting)
    snapshot.views()
    counting.admit("a", pod("p1"), CPU)
    broken = counting.views_named
    counting.views_named = lambda names: (_ for _ in ()).throw(RuntimeError("db gone"))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        snapshot.views()
    assert snapshot.health().status == "degraded"
    counting.views_named = broken  # type: ignore[method-assign]
    assert snapshot.views() == as_read(counting)  # the admission's event was consumed
    assert snapshot.health().status == "ok"


def test_readers_and_writers_at_once_end_equal(counting: CountingLedger) -> None:
    snapshot = NodeSnapshot(counting)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                views = snapshot.views()
                assert set(views) >= {"a", "b", "c"}
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    try:
        for i in range(30):
            counting.admit("abc"[i % 3], pod(f"p{i}"), Resources(100, GIB // 8))
            if i % 2:
                counting.release(f"p{i - 1}")
    finally:
        stop.set()
        for reader in readers:
            reader.join(10)
    assert errors == []
    assert snapshot.views() == as_read(counting)


def test_as_a_component_it_loads_at_start_and_follows_in_the_background(
    counting: CountingLedger,
) -> None:
    snapshot = NodeSnapshot(counting, interval=0.02)
    snapshot.start()
    try:
        assert snapshot.health().status == "ok"
        counting.admit("a", pod("p1"), CPU)
        wait_until(lambda: snapshot.views(max_age=60)["a"].held == CPU, 30, 0.01, "followed")
    finally:
        snapshot.stop()


# PostgreSQL numbers events when they are inserted, not when they commit.


@pytest.fixture
def slow_admission(postgres_url: str) -> Iterator[tuple[Ledger, Callable[[], None]]]:
    """A ledger on three nodes, and an admission on "a" whose transaction has taken its
    event id and waits; calling the second item commits it."""
    db = Database.from_url(postgres_url)
    ledger = Ledger(db)
    for name in ("a", "b", "c"):
        ledger.upsert_node(name, SPEC)
    connection = db.engine.connect()
    connection.begin()
    statements = LedgerStatements(connection)
    node = statements.lock_node_state("a")
    now = datetime.now(UTC)
    connection.execute(
        HOLDINGS.insert(),
        {
            "node_id": node.id, "holder_kind": "pod", "holder_id": "slow",
            "display_name": "ns/slow", "cpu_millis": 1000, "memory_bytes": GIB, "gpus": 0,
            "state": "held", "created_at": now, "updated_at": now,
        },
    )  # fmt: skip
    statements.insert_event(
        EventDraft(now, EventKind.ADMITTED, "a", "admitted ns/slow", resources=CPU)
    )
    try:
        yield ledger, connection.commit
    finally:
        connection.close()
        db.dispose()


@pytest.mark.postgres
def test_a_change_committed_after_a_later_one_is_not_missed(
    slow_admission: tuple[Ledger, Callable[[], None]],
) -> None:
    ledger, commit = slow_admission
    snapshot = NodeSnapshot(ledger)
    ledger.admit("b", pod("fast"), CPU)  # a later id, committed first
    assert snapshot.views()["b"].held == CPU
    assert snapshot.views()["a"].held == Resources.ZERO
    commit()
    assert snapshot.views()["a"].held == CPU
    assert snapshot.views() == as_read(ledger)


@pytest.mark.postgres
def test_a_change_in_flight_during_the_full_load_is_not_missed(
    slow_admission: tuple[Ledger, Callable[[], None]],
) -> None:
    ledger, commit = slow_admission
    ledger.admit("b", pod("fast"), CPU)
    snapshot = NodeSnapshot(ledger)
    snapshot.reload()  # starts after "fast", whose id is above the one "slow" holds
    assert snapshot.views()["a"].held == Resources.ZERO
    commit()
    assert snapshot.views()["a"].held == CPU
    assert snapshot.views() == as_read(ledger)


def test_views_are_a_base_with_changes_folded_in_once_in_a_while() -> None:
    def node(name: str, cpu: int = 8000) -> NodeView:
        now = datetime(2026, 1, 1, tzinfo=UTC)
        return NodeView(name, NodeSpec(Resources(cpu, GIB)), None, None, (), now, now)

    base = Views({n: node(n) for n in ("a", "b", "c")})
    changed = base.with_changes({"a": node("a", 4000), "b": None, "d": node("d")})
    assert dict(changed) == {"a": node("a", 4000), "c": node("c"), "d": node("d")}
    assert (len(changed), "b" in changed, changed.get("b")) == (3, False, None)
    assert dict(base) == {n: node(n) for n in ("a", "b", "c")}  # untouched
    again = changed.with_changes({"b": node("b", 2000), "d": None})
    assert dict(again) == {"a": node("a", 4000), "b": node("b", 2000), "c": node("c")}
    many = base.with_changes({f"n{i}": node(f"n{i}") for i in range(COMPACT_AFTER + 1)})
    assert many._changed == {}  # folded into the base
    assert len(many) == 3 + COMPACT_AFTER + 1
    assert many == {**dict(base), **{f"n{i}": node(f"n{i}") for i in range(COMPACT_AFTER + 1)}}


def test_own_writes_during_a_full_reload_are_seen_after_it(counting: CountingLedger) -> None:
    now = [0.0]
    snapshot = NodeSnapshot(counting, monotonic=lambda: now[0])
    snapshot.views()
    loading = counting.list_nodes

    def list_then_admit() -> list[NodeView]:
        views = loading()
        counting.admit("a", pod("during"), CPU)  # committed after the load read "a"
        snapshot.views(max_age=60)  # a refresh of the old views takes the commit flag
        return views

    counting.list_nodes = list_then_admit  # type: ignore[method-assign]
    snapshot.reload()
    counting.list_nodes = loading  # type: ignore[method-assign]
    assert snapshot.views(max_age=60)["a"].held == CPU
