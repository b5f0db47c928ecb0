"""The headroom's safety argument (app.core.headroom) under racing replicas, on a real
database (SQLite and PostgreSQL) and a model of slurmctld: admissions and releases on
three replicas, each with its own ledger, pusher and gate, against one fake Slurm node
whose jobs start only within the k8scpu count, as slurmctld's do. At every moment Slurm's
counts change or a job starts, the CPUs its jobs use plus what pods hold in the ledger
(HELD, committed) must fit the node. The same race through a real Slurm is
tests/slurm/test_headroom.py."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from app.admission.service import AdmissionRequest, Admissions, ReleaseRequest
from app.core.caps import KubeCaps
from app.core.gres import gres_count, with_counts
from app.core.headroom import HeadroomPolicy
from app.core.ledger_errors import AdmissionRejected, HoldingNotFound
from app.core.records import EventKind, Holder, HolderKind, NodeSpec, Release
from app.core.resources import Resources
from app.core.slurm_models import SlurmNode
from app.db.engine import Database
from app.ledger.service import Ledger
from app.slurm.gate import SlurmGate
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from tests.support.fake_slurm import GIB, FakeSlurm, NodeUpdate, slurm_node

REPLICAS = 3
CPUS = 16
# A headroom smaller than some pods, kept at one size: a stale grant after a release would
# let a pod in beyond what Slurm withholds.
POLICY = HeadroomPolicy(
    amount=Resources(1000, 2 * GIB), grow_step=0, max_factor=1, idle_seconds=3600, caps=KubeCaps()
)
# Room for releases to stay withheld as headroom (app.core.headroom.released_target): the
# target moves between 1 and 4 CPUs with every release and admission.
KEEPS_RELEASES = replace(POLICY, max_factor=4)
HELD_PODS = text(
    "SELECT COALESCE(SUM(cpu_millis), 0) FROM holdings WHERE holder_kind = 'pod' AND state = 'held'"
)


class SlurmModel(FakeSlurm):
    """One node of a busy cluster: jobs wait for it, and start the moment its k8scpu count
    leaves room (as slurmctld's do, under the node lock a node update also takes)."""

    def __init__(self, witness: Database) -> None:
        super().__init__(slurm_node(), latency=0.002)
        self.witness = witness
        self.violations: list[str] = []
        self.jobs_started = 0

    def _used(self) -> int:
        return gres_count(self.node.gres_used, "k8scpu")

    def get_node(self, name: str) -> SlurmNode:
        time.sleep(self.latency)  # a read-back takes a while too
        return super().get_node(name)

    def check(self, what: str) -> None:
        with self._lock:
            self._check(what)

    def _check(self, what: str) -> None:
        with self.witness.engine.connect() as connection:
            pods = int(connection.execute(HELD_PODS).scalar_one())
        used = self._used()
        if used * 1000 + pods > CPUS * 1000:
            self.violations.append(f"{what}: jobs use {used} CPUs, pods hold {pods}m")

    def after_update(self, name: str, update: NodeUpdate) -> None:
        self.fill()

    def fill(self) -> None:
        """Start waiting jobs of one CPU until the count is used up."""
        with self._lock:
            used, total = self._used(), gres_count(self.node.gres, "k8scpu")
            if used >= total:
                return
            self.node = replace(self.node, gres_used=with_counts("", {"k8scpu": total}))
            self.jobs_started += total - used
            self._check(f"jobs started up to k8scpu {total}")

    def end_jobs(self, cpus: int) -> None:
        with self._lock:
            used = max(0, self._used() - cpus)
            self.node = replace(self.node, gres_used=with_counts("", {"k8scpu": used}))


@pytest.fixture(params=[POLICY, KEEPS_RELEASES], ids=["one-size", "releases-kept"])
def policy(request: pytest.FixtureRequest) -> HeadroomPolicy:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def replicas(database_url: str, policy: HeadroomPolicy) -> Iterator[list[Ledger]]:
    databases = [Database.from_url(database_url, pool_size=20) for _ in range(REPLICAS + 1)]
    yield [Ledger(db, headroom=policy) for db in databases]
    for db in databases:
        db.dispose()


def test_jobs_and_pods_never_share_a_cpu_with_headroom_on_three_replicas(
    replicas: list[Ledger],
) -> None:
    witness, *ledgers = replicas
    witness.upsert_node("n1", NodeSpec(capacity=Resources(CPUS * 1000, 32000 * 2**20)))
    slurm = SlurmModel(witness.db)
    holds = HoldJobs(slurm)  # type: ignore[arg-type]
    gates = [SlurmGate(Pusher(slurm, ledger), KubeCaps(), holds=holds) for ledger in ledgers]  # type: ignore[arg-type]
    services = [Admissions(ledger, gate) for ledger, gate in zip(ledgers, gates, strict=True)]
    for gate in gates:
        gate.deferred = None  # push at once: more interleavings
    kept = count_releases_kept(ledgers)
    stop = threading.Event()

    def pods(worker: int) -> None:
        rng = random.Random(worker)
        mine: list[str] = []
        for i in range(60):
            service = services[rng.randrange(REPLICAS)]
            if mine and rng.random() < 0.4:
                uid = mine.pop(rng.randrange(len(mine)))
                with contextlib.suppress(HoldingNotFound):
                    service.release(ReleaseRequest(uid, HolderKind.POD))
                continue
            uid = f"w{worker}-{i}"
            request = Resources(rng.choice([500, 1000, 2000]), GIB)
            try:
                service.admit(AdmissionRequest("n1", Holder(HolderKind.POD, uid), request))
            except AdmissionRejected:
                continue
            mine.append(uid)
            slurm.check(f"{uid} admitted")

    def jobs() -> None:
        rng = random.Random(99)
        while not stop.is_set():
            slurm.end_jobs(rng.choice([1, 2, 3]))
            time.sleep(0.003)
            slurm.fill()

    slurm.fill()  # jobs on the node before the first pod, however the threads interleave
    job_thread = threading.Thread(target=jobs)
    job_thread.start()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(pods, range(8)))
    finally:
        stop.set()
        job_thread.join()
    admitted = witness.events(kind=EventKind.ADMITTED, limit=10_000)
    within = sum(1 for e in admitted if e.details.get("within_headroom"))
    print(f"{len(admitted)} admitted ({within} inside the headroom), {slurm.jobs_started} jobs")
    assert slurm.violations == []
    assert within > 0  # the headroom was used, not bypassed
    assert slurm.jobs_started > 0
    if replicas[0].headroom is KEEPS_RELEASES:
        assert kept, "no release stayed withheld as headroom"


def count_releases_kept(ledgers: list[Ledger]) -> list[Release]:
    """The releases whose freed amount stayed withheld as headroom (no push), as made."""
    kept: list[Release] = []
    for ledger in ledgers:

        def release(*args: Any, _release: Any = ledger.release, **kwargs: Any) -> Release:
            result: Release = _release(*args, **kwargs)
            if not result.withheld_fell:
                kept.append(result)
            return result

        ledger.release = release  # type: ignore[method-assign]
    return kept
