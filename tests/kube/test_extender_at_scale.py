"""1,000 nodes with 10 pods each: the extender's filter and prioritize over HTTP, answered
from the node snapshot, say exactly what the pure decisions say on a fresh read of the
ledger, also right after admissions and releases and changes by another replica, unless
the extender may answer that stale. Behaviour,
not timing (bench/ledger_scale.py measures). The Kubernetes API is a fake: filter and
prioritize never call it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.bootstrap import build_services
from app.core.caps import KubeCaps
from app.core.placement import filter_nodes, prioritize
from app.core.records import Holder, HolderKind
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger
from app.main import create_app
from app.settings import Settings
from tests.support.bulk import fill, node_name
from tests.support.extender import offline_extender

NODES = 1000
POD_CPU = 8000
CAPS = KubeCaps(cpu_fraction=0.9, memory_fraction=0.9)
POD = {
    "metadata": {"name": "web", "namespace": "default", "uid": "scale-uid"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "8"}}}]},
}
CANDIDATES = [node_name(i) for i in range(NODES)] + ["not-in-the-ledger"]


@pytest.fixture(params=[0.0, 60.0], ids=["strict", "stale-60s"])
def max_staleness(request: pytest.FixtureRequest) -> float:
    value: float = request.param
    return value


@pytest.fixture
def api(database_url: str, max_staleness: float) -> Iterator[TestClient]:
    fill(database_url, NODES)
    settings = Settings(database_url=database_url, migrate_on_start=False)
    services = offline_extender(build_services(settings), CAPS, max_staleness=max_staleness)
    # As with Kubernetes on: the read model is a component, started first.
    services = replace(services, components=(services.snapshot, *services.components))
    with TestClient(create_app(settings, services)) as client:
        yield client


def expected(ledger: Ledger) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    views = {v.name: v for v in ledger.list_nodes()}
    fits, failed = filter_nodes(Resources(POD_CPU), CANDIDATES, views, CAPS)
    scores = prioritize(CANDIDATES, views)
    return (
        {"NodeNames": fits, "FailedNodes": failed},
        [{"Host": h, "Score": s} for h, s in scores],
    )


def answered(api: TestClient) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    body = {"Pod": POD, "NodeNames": CANDIDATES}
    filtered = api.post("/v1/extender/filter", json=body)
    scored = api.post("/v1/extender/prioritize", json=body)
    assert filtered.status_code == scored.status_code == 200
    result = filtered.json()
    return {"NodeNames": result["NodeNames"], "FailedNodes": result["FailedNodes"]}, scored.json()


def per_node(
    answer: tuple[dict[str, Any], list[dict[str, Any]]],
) -> dict[str, tuple[str, int | None]]:
    """Each candidate's part of an answer: why it failed ("" when it fits) and its score."""
    result, scores = answer
    score = {s["Host"]: s["Score"] for s in scores}
    return {n: (result["FailedNodes"].get(n, ""), score.get(n)) for n in CANDIDATES}


def assert_each_as_then_or_now(
    seen: dict[str, tuple[str, int | None]],
    then: dict[str, tuple[str, int | None]],
    now: dict[str, tuple[str, int | None]],
) -> None:
    """Filter and prioritize are two calls: each may answer from views before or after the
    changes (the snapshot's background refresh may come between them)."""
    for name, (reason, score) in seen.items():
        assert reason in (then[name][0], now[name][0]), name
        assert score in (then[name][1], now[name][1]), name


def admit(api: TestClient, node: str, uid: str, cpu: str) -> None:
    body = {"node": node, "holder": {"kind": "pod", "uid": uid}, "requests": {"cpu": cpu}}
    assert api.post("/v1/admissions", json=body).status_code == 201


def test_the_snapshot_decides_like_a_fresh_read(
    api: TestClient, database_url: str, max_staleness: float
) -> None:
    ledger: Ledger = api.app.state.services.ledger  # type: ignore[attr-defined]
    before, scores = answered(api)
    assert (before, scores) == expected(ledger)
    assert len(before["NodeNames"]) > 500  # fits, failures of every kind
    reasons = "".join(before["FailedNodes"].values())
    for reason in ("insufficient", "DRAIN", "not managed", "Kubernetes share"):
        assert reason in reasons

    # Fill some fitting nodes, free some full ones (i % 6 == 5 holds 60 of 64 cores):
    # this replica's own changes, seen at once when strict; with an allowed staleness
    # they may be missed as long as another replica's (the scheduler counts the pods it
    # placed itself, and bind admits through the ledger)
    for i in range(0, 60, 6):
        admit(api, node_name(i), f"fill-{i}", "50")
    for i in range(5, 60, 6):
        assert api.delete(f"/v1/admissions/{i:05d}-00-bulk-pod").status_code == 200
    after, after_scores = answered(api)
    if max_staleness:
        now, then = per_node(expected(ledger)), per_node((before, scores))
        assert_each_as_then_or_now(per_node((after, after_scores)), then, now)
        api.app.state.services.snapshot.refresh()  # type: ignore[attr-defined]
        after, after_scores = answered(api)
    assert (after, after_scores) == expected(ledger)
    assert after != before

    # Another replica drains and cordons nodes and admits on them: seen at once when
    # strict; with 60 s of allowed staleness each node may still answer as before
    other_db = Database.from_url(database_url)
    try:
        other = Ledger(other_db)
        other.set_health(node_name(1), "Slurm node node-00001 is DOWN")
        other.upsert_node(node_name(2), other.get_node(node_name(2)).spec, cordon_reason="fw")
        other.admit(node_name(3), Holder(HolderKind.POD, "elsewhere"), Resources(20_000))
    finally:
        other_db.dispose()
    changed, scores = answered(api)
    if max_staleness:
        # Allowed to miss them, not bound to: the snapshot's own refresh (every second)
        # may have read any of the three meanwhile. Each node is as before them or after.
        now = per_node(expected(ledger))
        then = per_node((after, after_scores))
        assert_each_as_then_or_now(per_node((changed, scores)), then, now)
        return
    assert (changed, scores) == expected(ledger)
    for i in (1, 2, 3):
        assert node_name(i) in changed["FailedNodes"]
