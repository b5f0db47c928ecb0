"""Job and node hints with a fake slurmrestd and a real database: a hinted job reaches the
ledger without any full listing, leaves it once it stops holding its nodes (COMPLETING
included), moves when requeued; a hinted node's drain or resume reaches it likewise; and an
older listing never undoes a newer hint. The same against real slurmctld hooks:
tests/slurm/test_job_hints_hooks.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from app.bootstrap import build_services
from app.core.records import HolderKind, NodeSpec, NodeView
from app.core.resources import Resources
from app.core.slurm_models import JobAllocation, SlurmJob, SlurmNode
from app.db.engine import Database
from app.ledger.service import Ledger
from app.main import create_app
from app.metrics.registry import Metrics
from app.settings import Settings
from app.slurm import hint_queue as hint_queue_module
from app.slurm import sync as sync_module
from app.slurm.hint_queue import WATCHER_ALIVE, HintQueue
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from app.slurm.sync import SlurmSync
from tests.support.fake_slurm import MIB, TwoNodeSlurm, slurm_node
from tests.support.realenv import wait_until


def job(job_id: str, node: str, *states: str, cpus: int = 2) -> SlurmJob:
    allocation = JobAllocation(node, cpus, 1000, 0)
    return SlurmJob(job_id, "wrap", "alice", frozenset(states or {"RUNNING"}), (allocation,))


@pytest.fixture
def slurm() -> TwoNodeSlurm:
    return TwoNodeSlurm()


@pytest.fixture
def hints(database: Database) -> HintQueue:
    return HintQueue(database)


@pytest.fixture
def sync(ledger: Ledger, slurm: TwoNodeSlurm, hints: HintQueue) -> Iterator[SlurmSync]:
    for name in ("n1", "n2"):
        ledger.upsert_node(name, NodeSpec(capacity=Resources(16000, 32000 * MIB)))
    sync = slurm_sync(ledger, slurm, hints, full_sync_interval=300)
    full_listing(sync)
    yield sync
    sync.stop()


def slurm_sync(ledger: Ledger, slurm: TwoNodeSlurm, hints: HintQueue, **options: Any) -> SlurmSync:
    """A sync of ``slurm`` taking ``hints``; ``options``: SlurmSync's keywords."""
    return SlurmSync(
        slurm,  # type: ignore[arg-type]
        ledger,
        Pusher(slurm, ledger),  # type: ignore[arg-type]
        holds=HoldJobs(slurm),  # type: ignore[arg-type]
        hints=hints,
        **options,
    )


def full_listing(sync: SlurmSync) -> None:
    """One step that starts a background listing (slurmctld "restarted", so one is due),
    and the step that applies it."""
    sync.client.ctld_started += 1  # type: ignore[attr-defined]
    sync.step()
    assert sync.listings.pending is not None
    sync.listings.pending.result(timeout=10)
    sync.step()


def held(ledger: Ledger, node: str) -> dict[str, int]:
    return {
        h.holder.id: h.resources.cpu_millis
        for h in ledger.get_node(node).holdings
        if h.holder.kind is HolderKind.SLURM_JOB
    }


def test_a_hinted_start_reaches_the_ledger_with_no_listing(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    listings = slurm.listings
    slurm.jobs["7"] = job("7", "n1", "RUNNING", "CONFIGURING")
    hints.post([7])
    assert sync.apply_hints() == []
    assert held(ledger, "n1") == {"7": 2000}
    assert sync.state.snapshot().jobs_on("n1") == [slurm.jobs["7"]]
    sync.step()  # not due: no listing
    assert slurm.listings == listings


def test_a_hint_wakes_the_running_loop(
    ledger: Ledger, slurm: TwoNodeSlurm, hints: HintQueue
) -> None:
    """Steps 10 minutes apart: only the hint's wake-up can explain a holding within 30 s
    (generous, for a busy machine; it takes milliseconds)."""
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * MIB)))
    sync = slurm_sync(ledger, slurm, hints, interval=600, full_sync_interval=3000)
    sync.start()
    try:
        wait_until(lambda: sync.health().status == "ok", 30, what="the first step")
        slurm.jobs["7"] = job("7", "n1")
        posted = time.monotonic()
        hints.post([7])
        wait_until(lambda: held(ledger, "n1") == {"7": 2000}, 30, interval=0.01, what="held")
        print(f"hint -> ledger in {time.monotonic() - posted:.3f}s")
    finally:
        sync.stop()


def test_a_job_hinted_while_completing_is_released_once_it_lets_go(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    slurm.jobs["7"] = job("7", "n1")
    hints.post([7])
    sync.apply_hints()
    slurm.jobs["7"] = job("7", "n1", "COMPLETING")  # the Epilog hint comes this early
    hints.post([7])
    sync.apply_hints()
    assert held(ledger, "n1") == {"7": 2000}  # COMPLETING still holds the node
    slurm.jobs["7"] = job("7", "n1", "COMPLETED")
    sync.apply_hints()  # no hint: read again because it was COMPLETING
    assert held(ledger, "n1") == {}


def test_a_requeued_job_moves(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    slurm.jobs["7"] = job("7", "n1")
    hints.post([7])
    sync.apply_hints()
    slurm.jobs["7"] = replace(job("7", "n1", "PENDING", "REQUEUED"), allocations=())
    hints.post([7])
    sync.apply_hints()
    assert held(ledger, "n1") == {}
    slurm.jobs["7"] = job("7", "n2")
    hints.post([7])
    sync.apply_hints()
    assert (held(ledger, "n1"), held(ledger, "n2")) == ({}, {"7": 2000})


def test_an_older_listing_never_undoes_a_newer_hint(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    slurm.jobs["8"] = job("8", "n2")
    hints.post([8])
    sync.apply_hints()
    slurm.ctld_started += 1  # a restart: a listing at once, although not due
    slurm.hold_listing.clear()
    sync.step()
    assert sync.listings.pending is not None  # reading: it sees job 8 running, not job 7
    slurm.jobs["7"] = job("7", "n1")
    del slurm.jobs["8"]
    hints.post([7, 8])
    sync.apply_hints()
    slurm.hold_listing.set()
    sync.listings.pending.result(timeout=10)
    sync.step()  # applies the listing
    assert (held(ledger, "n1"), held(ledger, "n2")) == ({"7": 2000}, {})
    full_listing(sync)  # a listing that began after the hints: the same
    assert (held(ledger, "n1"), held(ledger, "n2")) == ({"7": 2000}, {})


def test_a_job_listed_as_allocated_before_its_hint_is_not_counted_twice(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    """The node reports the CPUs of a job the job listing missed (``node:n1``); when the
    job's hint comes, those CPUs are the job's, not on top of it."""
    slurm.nodes["n1"] = replace(slurm.nodes["n1"], alloc_cpus=2, alloc_memory_mb=1000)
    full_listing(sync)
    assert held(ledger, "n1") == {"node:n1": 2000}
    slurm.jobs["7"] = job("7", "n1")
    hints.post([7])
    sync.apply_hints()
    assert held(ledger, "n1") == {"7": 2000}


def test_a_flood_of_hints_becomes_one_full_listing(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hint_queue_module, "MAX_TAKEN", 3)
    hints.post([1, 2, 3, 4])
    listings = slurm.listings
    sync.apply_hints()
    assert hints.take() == set()  # dropped
    full_listing(sync)
    assert slurm.listings == listings + 1


def test_a_standby_leaves_hints_for_the_leader(
    ledger: Ledger, slurm: TwoNodeSlurm, hints: HintQueue, database: Database
) -> None:
    class Standby:
        def check(self) -> bool:
            return False

        def release(self) -> None:
            pass

    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * MIB)))
    standby = SlurmSync(
        slurm,  # type: ignore[arg-type]
        ledger,
        Pusher(slurm, ledger),  # type: ignore[arg-type]
        holds=HoldJobs(slurm),  # type: ignore[arg-type]
        hints=hints,
        leadership=Standby(),  # type: ignore[arg-type]
    )
    slurm.jobs["7"] = job("7", "n1")
    hints.post([7])
    standby.step()
    assert held(ledger, "n1") == {}
    assert HintQueue(database).take() == {"7"}  # still there, for whoever leads


# ---------------------------------------------------------------------------- node hints


def drained(name: str, reason: str = "hw") -> SlurmNode:
    return slurm_node(name=name, states=frozenset({"IDLE", "DRAIN"}), reason=reason)


def test_a_hinted_drain_and_resume_reach_the_ledger_with_no_listing(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    listings = slurm.listings
    slurm.nodes["n2"] = drained("n2")
    hints.post_nodes(["n2"])
    assert sync.apply_hints() == []
    assert ledger.get_node("n2").not_admissible_reason == "Slurm node n2 is DRAIN+IDLE: hw"
    assert ledger.get_node("n1").admissible
    slurm.nodes["n2"] = slurm_node(name="n2")
    hints.post_nodes(["n2"])
    sync.apply_hints()
    assert ledger.get_node("n2").admissible
    sync.step()  # not due: no listing
    assert slurm.listings == listings


def test_an_older_listing_never_undoes_a_newer_node_hint(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    slurm.ctld_started += 1  # a restart: a listing at once, although not due
    slurm.hold_listing.clear()
    sync.step()
    assert sync.listings.pending is not None  # reading: it sees n2 idle
    slurm.nodes["n2"] = drained("n2")
    hints.post_nodes(["n2"])
    sync.apply_hints()
    slurm.hold_listing.set()
    sync.listings.pending.result(timeout=10)
    sync.step()  # applies the listing
    assert not ledger.get_node("n2").admissible
    full_listing(sync)  # one that began after the hint: the same
    assert not ledger.get_node("n2").admissible


def test_every_node_hinted_is_one_full_listing(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    slurm.nodes["n1"], slurm.nodes["n2"] = drained("n1"), drained("n2")
    hints.post_nodes(["*", "n1"])
    listings = slurm.listings
    sync.apply_hints()
    assert hints.take_nodes() == set()  # taken, "n1" with it
    full_listing(sync)
    assert slurm.listings == listings + 1
    assert not ledger.get_node("n1").admissible
    assert not ledger.get_node("n2").admissible


def test_a_node_hint_for_a_node_the_ledger_lacks_is_dropped(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue
) -> None:
    hints.post_nodes(["n9"])  # not in the ledger: no read
    reads = slurm.node_reads
    assert sync.apply_hints() == []
    assert slurm.node_reads == reads
    assert hints.take_nodes() == set()


def test_the_watchers_heartbeat_reads_nothing(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue
) -> None:
    hints.post_nodes([])  # the plugin's heartbeat: no node changed
    reads, listings = slurm.node_reads, slurm.listings
    assert sync.apply_hints() == []
    assert (slurm.node_reads, slurm.listings) == (reads, listings)
    assert sync.hinted is not None
    quiet = sync.hinted.quiet_for()
    assert quiet is not None
    assert quiet < 5  # heard: the watcher runs


def test_node_hints_gone_quiet_show_in_health_and_metrics(
    ledger: Ledger, slurm: TwoNodeSlurm, hints: HintQueue
) -> None:
    """The plugin posts at least every minute: three minutes of silence mean its watcher
    stopped or its hook fails. Ready still (the full listing brings node states), but
    /readyz says since when, and the age is a metric for the alert."""
    clock = [1000.0]
    metrics = Metrics(CollectorRegistry(), monotonic=lambda: clock[0])
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * MIB)))
    sync = slurm_sync(
        ledger, slurm, hints, full_sync_interval=300, monotonic=lambda: clock[0], metrics=metrics
    )

    def age() -> float | None:
        return metrics.registry.get_sample_value("nodeledger_slurm_node_hint_age_seconds")  # type: ignore[union-attr]

    full_listing(sync)
    clock[0] += 3600  # no node hint ever (no plugin): nothing to say
    assert (sync.health().status, age()) == ("ok", None)
    hints.post_nodes([])
    sync.apply_hints()
    clock[0] += 180
    assert (sync.health().status, age()) == ("ok", 180)
    clock[0] += 1
    health = sync.health()
    assert (health.status, age()) == ("degraded", 181)
    assert "node hints stale since " in health.message
    assert "(none for 181s)" in health.message
    hints.post_nodes(["n1"])  # any node hint says the watcher runs
    sync.apply_hints()
    assert (sync.health().status, age()) == ("ok", 0)
    sync.stop()


# ---------------------------------------------------------------------------- the endpoint


@pytest.fixture
def hints_api(sqlite_url: str) -> Iterator[tuple[TestClient, HintQueue]]:
    settings = Settings(database_url=sqlite_url)
    services = build_services(settings)
    # As the Slurm integration has them, without a sync.
    services = replace(services, job_hints=HintQueue(services.db))
    with TestClient(create_app(settings, services)) as api:
        yield api, services.job_hints


def test_hints_are_accepted_at_once(hints_api: tuple[TestClient, HintQueue]) -> None:
    api, hints = hints_api
    answer = api.post("/v1/slurm/job-hints", json={"job_ids": [12, 12, 4294967295]})
    assert (answer.status_code, answer.json()) == (202, {"accepted": 2})
    assert hints.take() == {"12", "4294967295"}


def test_node_hints_are_accepted_at_once(hints_api: tuple[TestClient, HintQueue]) -> None:
    api, hints = hints_api
    answer = api.post("/v1/slurm/node-hints", json={"nodes": ["n1", "n1", "gpu-01.rack_2"]})
    assert (answer.status_code, answer.json()) == (202, {"accepted": 2})
    assert hints.take_nodes() == {"n1", "gpu-01.rack_2"}
    assert hints.take() == set()  # the job hints are apart
    answer = api.post("/v1/slurm/node-hints", json={"nodes": ["*"]})
    assert answer.status_code == 202
    assert hints.take_nodes() is None  # every node: a full listing
    answer = api.post("/v1/slurm/node-hints", json={"nodes": []})  # the heartbeat
    assert (answer.status_code, answer.json()) == (202, {"accepted": 0})
    assert hints.take_nodes() == {WATCHER_ALIVE}


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        pytest.param({}, ["body", "nodes"], id="missing"),
        pytest.param({"nodes": [7]}, ["body", "nodes", 0], id="number"),
        pytest.param({"nodes": ["n1", "n[1-4]"]}, ["body", "nodes", 1], id="hostlist"),
        pytest.param({"nodes": ["n 1"]}, ["body", "nodes", 0], id="space"),
        pytest.param({"nodes": ["x" * 257]}, ["body", "nodes", 0], id="too-long"),
        pytest.param({"nodes": [f"n{i}" for i in range(1001)]}, ["body", "nodes"], id="too-many"),
        pytest.param({"nodes": ["n1"], "job_ids": [1]}, ["body", "job_ids"], id="unknown-field"),
    ],
)
def test_bad_node_hints_are_422_naming_the_field(
    hints_api: tuple[TestClient, HintQueue], body: dict[str, object], loc: list[object]
) -> None:
    answer = hints_api[0].post("/v1/slurm/node-hints", json=body)
    assert answer.status_code == 422
    assert loc in [e["loc"] for e in answer.json()["detail"]]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        pytest.param({}, ["body", "job_ids"], id="missing"),
        pytest.param({"job_ids": []}, ["body", "job_ids"], id="empty"),
        pytest.param({"job_ids": ["12"]}, ["body", "job_ids", 0], id="string"),
        pytest.param({"job_ids": [True]}, ["body", "job_ids", 0], id="bool"),
        pytest.param({"job_ids": [1, 0]}, ["body", "job_ids", 1], id="zero"),
        pytest.param({"job_ids": [2**32]}, ["body", "job_ids", 0], id="too-big"),
        pytest.param({"job_ids": list(range(1, 1002))}, ["body", "job_ids"], id="too-many"),
        pytest.param({"job_ids": [1], "node": "n1"}, ["body", "node"], id="unknown-field"),
    ],
)
def test_bad_hints_are_422_naming_the_field(
    hints_api: tuple[TestClient, HintQueue], body: dict[str, object], loc: list[object]
) -> None:
    answer = hints_api[0].post("/v1/slurm/job-hints", json=body)
    assert answer.status_code == 422
    assert loc in [e["loc"] for e in answer.json()["detail"]]


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/slurm/job-hints", {"job_ids": [1]}), ("/v1/slurm/node-hints", {"nodes": ["n1"]})],
)
def test_hints_without_the_slurm_integration_are_409(
    api: TestClient, path: str, body: dict[str, object]
) -> None:
    answer = api.post(path, json=body)
    assert answer.status_code == 409
    assert "NODELEDGER_SLURM_ENABLED" in answer.json()["detail"]


def test_a_node_pushed_for_drift_is_not_pushed_again_by_every_full_pass(
    sync: SlurmSync, slurm: TwoNodeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The push's read-back replaces the listing's node. Found at 1,003 nodes: each full
    pass pushed (read) every node the last listing showed drifted, seconds in which hints
    waited; at 15,000 nodes most of a minute, every 30 s."""
    slurm.nodes["n1"] = replace(slurm.nodes["n1"], gres="k8scpu:3,k8smemory:32000")
    full_listing(sync)  # lists n1 with counts the ledger does not withhold: pushed
    assert slurm.nodes["n1"].gres == "k8scpu:16,k8smemory:32000"
    reads = slurm.node_reads
    monkeypatch.setattr(sync_module, "FULL_PASS_EVERY", 1)  # every step a full pass
    for _ in range(3):
        sync.step()
    assert slurm.node_reads == reads


def test_hints_are_applied_during_a_long_full_pass(
    sync: SlurmSync, slurm: TwoNodeSlurm, hints: HintQueue, ledger: Ledger
) -> None:
    """A full pass that pushes every node (after a slurmctld restart) takes minutes at
    15,000 nodes: a hint posted meanwhile is applied within it, not after it."""
    seen: list[dict[str, int]] = []
    sync_node = sync.reconciler.sync

    def slow_sync_node(view: NodeView) -> bool:  # the pass: n1, then n2
        if view.name == "n1":
            slurm.jobs["7"] = job("7", "n2")
            hints.post([7])
            time.sleep(sync_module.HINT_POLL + 0.05)
        drifted = sync_node(view)
        if view.name == "n2":
            seen.append(held(ledger, "n2"))  # first: after the earliest sync of n2
        return drifted

    sync.reconciler.sync = slow_sync_node  # type: ignore[method-assign]
    sync.reconciler.forget()  # the ledger's nodes "changed": a full pass
    sync.step()
    assert seen[0] == {"7": 2000}  # the hint's sync of n2 came before the pass's
