"""Following the event log never misses an event that commits after a later one
(PostgreSQL numbers events at insert, not at commit)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.core.records import EventKind, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.events import EventDraft
from app.ledger.follow import EventFollower
from app.ledger.service import Ledger
from app.ledger.statements import LedgerStatements


def nodes_of(events: list) -> list[str | None]:  # type: ignore[type-arg]
    return [e.node for e in events]


def test_follows_in_order_from_the_end_of_the_log(ledger: Ledger) -> None:
    ledger.record_event(EventKind.SLURM_PUSHED, "before", "not seen: it predates the follower")
    follower = EventFollower(ledger)
    assert follower.poll() == []
    ledger.upsert_node("a", NodeSpec(capacity=Resources(1000, 2**30)))
    ledger.record_event(EventKind.SLURM_PUSHED, "b", "pushed")
    assert nodes_of(follower.poll()) == ["a", "b"]
    assert follower.poll() == []


def test_start_begins_at_the_end_of_the_log(ledger: Ledger) -> None:
    ledger.record_event(EventKind.SLURM_PUSHED, "before", "not seen: it predates the start")
    follower = EventFollower(ledger)
    follower.start()
    assert follower.poll() == []
    ledger.record_event(EventKind.SLURM_PUSHED, "after", "pushed")
    assert nodes_of(follower.poll()) == ["after"]


@pytest.mark.postgres
def test_start_still_sees_an_event_that_commits_after_it(postgres_url: str) -> None:
    db = Database.from_url(postgres_url)
    try:
        ledger = Ledger(db)
        slow = db.engine.connect()
        slow.begin()
        LedgerStatements(slow).insert_event(  # takes the lower id, commits last
            EventDraft(datetime.now(UTC), EventKind.SLURM_PUSHED, "slow", "committed late")
        )
        ledger.record_event(EventKind.SLURM_PUSHED, "fast", "committed before the start")
        follower = EventFollower(ledger)
        follower.start()
        assert follower.poll() == []
        slow.commit()
        slow.close()
        assert nodes_of(follower.poll()) == ["slow"]
    finally:
        db.dispose()


@pytest.mark.postgres
def test_an_event_committed_after_a_later_one_is_still_seen(postgres_url: str) -> None:
    db = Database.from_url(postgres_url)
    try:
        ledger = Ledger(db)
        follower = EventFollower(ledger)
        follower.poll()
        slow = db.engine.connect()
        slow.begin()
        LedgerStatements(slow).insert_event(  # takes the lower id, commits last
            EventDraft(datetime.now(UTC), EventKind.SLURM_PUSHED, "slow", "committed late")
        )
        ledger.record_event(EventKind.SLURM_PUSHED, "fast", "committed first")
        assert nodes_of(follower.poll()) == ["fast"]
        slow.commit()
        slow.close()
        assert nodes_of(follower.poll()) == ["slow"]
        assert follower.poll() == []
    finally:
        db.dispose()


@pytest.mark.postgres
def test_a_rolled_back_event_leaves_a_gap_that_is_given_up(postgres_url: str) -> None:
    db = Database.from_url(postgres_url)
    try:
        ledger = Ledger(db)
        clock = [0.0]
        follower = EventFollower(ledger, patience=30, monotonic=lambda: clock[0])
        follower.poll()
        with db.engine.connect() as connection:
            LedgerStatements(connection).insert_event(
                EventDraft(datetime.now(UTC), EventKind.SLURM_PUSHED, "never", "rolled back")
            )
            connection.rollback()
        ledger.record_event(EventKind.SLURM_PUSHED, "after", "committed")
        assert nodes_of(follower.poll()) == ["after"]
        assert follower.given_up == 0  # the gap is still looked for, within its patience
        clock[0] = 31.0
        assert follower.poll() == []
        assert follower.given_up == 1  # what app.ledger.snapshot reloads everything for
    finally:
        db.dispose()
