"""Several replicas on one database: pushes to a node never overlap and the last one always
carries every hold (app.db.locks). Each replica is its own engine, ledger and pusher; the
database is real (SQLite and PostgreSQL), slurmrestd is a fake whose updates take a while,
so that unlocked pushes would overlap. The race through real replicas and a real Slurm is
tests/slurm/test_race.py; this test pins the lock itself down."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.admission.service import AdmissionRequest, Admissions, ReleaseRequest
from app.core.caps import KubeCaps
from app.core.counts import SlurmUnits, desired_counts, held_units, withheld
from app.core.gres import gres_count
from app.core.headroom import HeadroomPolicy
from app.core.records import EventKind, Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.db.locks import Leadership
from app.ledger.service import Ledger
from app.slurm.gate import SlurmGate
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from tests.support.fake_slurm import GIB, FakeSlurm, NodeUpdate, slurm_node

REPLICAS = 3


class OverlapWatch(FakeSlurm):
    """Counts updates of one node in flight at once, across every replica."""

    def __init__(self) -> None:
        super().__init__(slurm_node(), latency=0.005)
        self.in_flight = 0
        self.most_in_flight = 0
        self._count = threading.Lock()

    def before_update(self, name: str, update: NodeUpdate) -> None:
        with self._count:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def after_update(self, name: str, update: NodeUpdate) -> None:
        with self._count:
            self.in_flight -= 1


@pytest.fixture
def replica_ledgers(database_url: str) -> Iterator[list[Ledger]]:
    databases = [Database.from_url(database_url, pool_size=20) for _ in range(REPLICAS)]
    yield [Ledger(db) for db in databases]
    for db in databases:
        db.dispose()


@pytest.fixture
def headroom_ledgers(database_url: str) -> Iterator[list[Ledger]]:
    databases = [Database.from_url(database_url, pool_size=20) for _ in range(REPLICAS)]
    policy = HeadroomPolicy(amount=Resources(1000, GIB), caps=KubeCaps())
    yield [Ledger(db, headroom=policy) for db in databases]
    for db in databases:
        db.dispose()


def test_pushes_to_a_node_never_overlap_across_replicas_and_end_exact(
    replica_ledgers: list[Ledger],
) -> None:
    replica_ledgers[0].upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    slurm = OverlapWatch()
    holds = HoldJobs(slurm)  # type: ignore[arg-type]
    admissions = [
        Admissions(ledger, SlurmGate(Pusher(slurm, ledger), KubeCaps(), holds=holds))  # type: ignore[arg-type]
        for ledger in replica_ledgers
    ]

    def churn(i: int) -> None:
        replica = admissions[i % REPLICAS]
        holder = Holder(HolderKind.POD, f"uid-{i}", f"ns/p{i}")
        # 36 of these fit together: releases may all come last.
        replica.admit(AdmissionRequest("n1", holder, Resources(250, GIB // 2)))
        if i % 3 == 0:  # some pods go again, through another replica
            admissions[(i + 1) % REPLICAS].release(ReleaseRequest(holder.id, HolderKind.POD))

    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(churn, range(36)))
    assert slurm.most_in_flight == 1
    # The counts in Slurm are exactly what the ledger withholds now: no stale push landed last.
    view = replica_ledgers[1].get_node("n1")
    assert withheld(view) == SlurmUnits(6, 12 * 1024, 0)  # 24 pods of 250m / 512 MiB remain
    expected = desired_counts(slurm_node(), withheld(view))
    assert slurm.node.gres == f"k8scpu:{expected.k8scpu},k8smemory:{expected.k8smemory}"


@pytest.mark.postgres
def test_one_replica_leads_and_the_role_moves_when_it_dies(postgres_url: str) -> None:
    databases = [Database.from_url(postgres_url) for _ in range(2)]
    try:
        first, second = (Leadership(db, "slurm-sync") for db in databases)
        assert first.check()
        assert not second.check()
        assert first.check()  # still held, nothing changed
        # The leader's connection dies, as when its replica is killed.
        with databases[1].engine.begin() as connection:
            killed = connection.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks"
                " WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).scalar()
        assert killed == 1
        assert second.check()  # the lock went with the connection
        assert not first.check()  # and the old leader notices it no longer leads
        second.release()
        assert first.check()
    finally:
        for db in databases:
            db.dispose()


def test_with_a_headroom_pushes_never_overlap_and_slurm_withholds_what_pods_hold(
    headroom_ledgers: list[Ledger],
) -> None:
    """Admissions inside the headroom push nothing, so the counts end at least (not exactly)
    what the ledger holds; the pushes that do run still never overlap."""
    headroom_ledgers[0].upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    slurm = OverlapWatch()
    holds = HoldJobs(slurm)  # type: ignore[arg-type]
    admissions = [
        Admissions(ledger, SlurmGate(Pusher(slurm, ledger), KubeCaps(), holds=holds))  # type: ignore[arg-type]
        for ledger in headroom_ledgers
    ]

    def churn(i: int) -> None:
        holder = Holder(HolderKind.POD, f"uid-{i}", f"ns/p{i}")
        admissions[i % REPLICAS].admit(AdmissionRequest("n1", holder, Resources(250, GIB // 2)))
        if i % 3 == 0:
            admissions[(i + 1) % REPLICAS].release(ReleaseRequest(holder.id, HolderKind.POD))

    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(churn, range(36)))
    assert slurm.most_in_flight == 1
    view = headroom_ledgers[1].get_node("n1")
    left = desired_counts(slurm_node(), held_units(view))
    assert gres_count(slurm.node.gres, "k8scpu") <= left.k8scpu
    assert gres_count(slurm.node.gres, "k8smemory") <= left.k8smemory
    within = headroom_ledgers[0].events(kind=EventKind.ADMITTED, limit=100)
    assert any(e.details.get("within_headroom") for e in within)
