"""The Kubernetes side's pure parts and loops, with fakes: extender decisions, GenericNode
status, rate limiting, and the list-watch loop's recovery from expired watches."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from app.core.caps import KubeCaps
from app.core.components import Health
from app.core.genericnode import MIRRORED, fingerprint, status_of
from app.core.placement import filter_nodes, prioritize
from app.core.rate import TokenBucket
from app.core.records import (
    Holder,
    HolderKind,
    NodeHeadroom,
    NodeSpec,
    NodeView,
)
from app.core.resources import Resources
from app.kube.client import KubeError
from app.kube.controllers import leader
from app.kube.controllers.mirror import StatusMirror, _Status
from app.kube.controllers.watch import ListWatch
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from tests.support import builders
from tests.support.fake_kube import FakeStatusClient, FakeWatchClient, Recorder
from tests.support.headroom import set_headroom
from tests.support.realenv import wait_until

GIB = 2**30
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def view(name: str, slurm_cpu: int = 0, pod_cpu: int = 0, health: str | None = None) -> NodeView:
    holdings = []
    for kind, cpu in ((HolderKind.SLURM_JOB, slurm_cpu), (HolderKind.POD, pod_cpu)):
        if cpu:
            resources = Resources(cpu, GIB)
            holdings.append(builders.holding(kind, f"{kind.value}-1", resources, node=name, at=T0))
    spec = NodeSpec(capacity=Resources(16000, 32 * GIB, 2))
    return builders.node_view(spec, *holdings, name=name, health=health, at=T0)


def test_filter_keeps_nodes_with_room_and_says_why_for_the_rest() -> None:
    views = {
        "a": view("a"),
        "b": view("b", slurm_cpu=15000),
        "c": view("c", health="Slurm node c is DOWN"),
    }
    fits, failed = filter_nodes(Resources(2000, GIB), ["a", "b", "c", "x"], views)
    assert fits == ["a"]
    assert "cpu: requested 2, free 1" in failed["b"]
    assert failed["c"] == "Slurm node c is DOWN"
    assert "not managed" in failed["x"]


def test_filter_applies_the_kubernetes_cap() -> None:
    views = {"a": view("a", pod_cpu=7000)}
    fits, failed = filter_nodes(Resources(2000, GIB), ["a"], views, KubeCaps(cpu_fraction=0.5))
    assert fits == []
    assert "cap 8" in failed["a"]


def test_prioritize_prefers_idle_slurm_nodes() -> None:
    views = {
        "busy": view("busy", slurm_cpu=12000),
        "idle": view("idle"),
        "some": view("some", pod_cpu=8000),
    }
    scores = dict(prioritize(["busy", "idle", "some"], views))
    assert scores["idle"] > scores["some"] > scores["busy"]
    assert all(0 <= s <= 10 for s in scores.values())


def test_genericnode_status_keeps_transition_times_until_something_changes() -> None:
    node = view("a", slurm_cpu=4000, pod_cpu=1500)
    first = status_of(node, Health("ok"), {}, T0, "nvidia.com/gpu")
    assert first["allocatedResources"][0] == {
        "type": "Kubernetes", "allocated": {"cpu": "1500m", "memory": "1Gi", "nvidia.com/gpu": "0"}
    }  # fmt: skip
    assert first["free"]["cpu"] == "10500m"
    later = datetime(2026, 1, 2, tzinfo=UTC)
    again = status_of(node, Health("ok"), first, later, "nvidia.com/gpu")
    assert fingerprint(first) == fingerprint(again)  # what the mirror compares
    down = status_of(node, Health("degraded", "Slurm unreachable"), first, later, "nvidia.com/gpu")
    synced = {c["type"]: c for c in down["conditions"]}["SlurmSynced"]
    assert synced["status"] == "False"
    assert synced["lastTransitionTime"] == "2026-01-02T00:00:00Z"
    assert {c["type"]: c for c in down["conditions"]}["Ready"][
        "lastTransitionTime"
    ] == "2026-01-01T00:00:00Z"


def test_genericnode_status_shows_the_headroom() -> None:
    node = view("a", slurm_cpu=4000, pod_cpu=1500)
    off = status_of(node, Health("ok"), {}, T0, "nvidia.com/gpu")
    zero = {"cpu": "0", "memory": "0", "nvidia.com/gpu": "0"}
    assert off["headroom"] == {"target": zero, "granted": zero, "free": zero}
    headroom = NodeHeadroom(Resources(2000, 4 * GIB, 1), Resources(3500, 5 * GIB, 1), T0)
    on = status_of(replace(node, headroom=headroom), Health("ok"), off, T0, "nvidia.com/gpu")
    assert on["headroom"] == {
        "target": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
        "granted": {"cpu": "3500m", "memory": "5Gi", "nvidia.com/gpu": "1"},
        # granted - the pod's 1500m and 1Gi; what Slurm holds is not in the grant
        "free": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
    }
    assert fingerprint(on) != fingerprint(off)  # the mirror writes a headroom change
    # The last use alone changes nothing the mirror writes.
    later = replace(headroom, used_at=datetime(2026, 1, 2, tzinfo=UTC))
    again = status_of(replace(node, headroom=later), Health("ok"), on, T0, "nvidia.com/gpu")
    assert fingerprint(again) == fingerprint(on)
    # Held beyond the grant: free is 0, never negative.
    short = replace(headroom, granted=Resources(1000))
    lowered = status_of(replace(node, headroom=short), Health("ok"), on, T0, "nvidia.com/gpu")
    assert lowered["headroom"]["free"] == zero


def test_the_resync_reads_every_mirrored_field_of_a_genericnode() -> None:
    # The LIST decodes only the fields of this shape: one missing would differ every time.
    assert set(MIRRORED) <= set(_Status.__annotations__)


def test_token_bucket_spreads_a_thousand_writes() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=20, burst=50, monotonic=lambda: now[0])
    written = 0
    while now[0] < 1.0:
        if bucket.wait_time() == 0:
            written += 1
        else:
            now[0] += 0.01
    assert written <= 50 + 20 + 1  # burst, then the rate


def test_an_expired_watch_relists_and_the_handler_resyncs() -> None:
    stop = threading.Event()
    client, handler = FakeWatchClient(), Recorder(stop)
    ListWatch("things", client, "/things", handler).run(stop)  # type: ignore[arg-type]
    assert client.lists == 2  # listed again after the 410
    assert client.watched_from == ["rv-1", "rv-2"]  # each watch from its list's version
    assert handler.resyncs == [["x"], ["x"]]
    assert handler.events == [("ADDED", "y")]  # bookmarks are not events


class ChangingClient:
    """One list (x, z), then watches: x deleted, y added; the second watch stops it."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.lists = 0
        self.watches = 0

    def list(
        self, path: str, decode: Callable[[dict[str, Any]], Any], shape: Any = None, **query: Any
    ) -> tuple[list[Any], str]:
        self.lists += 1
        return [decode({"metadata": {"name": n}}) for n in ("x", "z")], "1"

    def watch(self, path: str, version: str, timeout: int, **query: Any) -> Any:
        self.watches += 1
        if self.watches == 1:
            yield {"type": "DELETED", "object": {"metadata": {"name": "x", "resourceVersion": "2"}}}
            yield {"type": "ADDED", "object": {"metadata": {"name": "y", "resourceVersion": "3"}}}
        else:
            self.stop.set()
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "4"}}}


class Keeper(Recorder):
    def on_event(self, kind: str, name: str) -> None:
        self.events.append((kind, name))  # goes on watching


def test_the_periodic_resync_is_of_what_the_watch_kept_not_a_new_list() -> None:
    """At 150,000 pods a LIST costs seconds of API server time: the resync period replays
    the list as the events changed it, as client-go's informers do."""
    stop = threading.Event()
    client, handler = ChangingClient(stop), Keeper(stop)
    ListWatch("things", client, "/things", handler, resync_period=0).run(stop)  # type: ignore[arg-type]
    assert client.lists == 1
    assert handler.resyncs == [["x", "z"], ["x", "z"], ["z", "y"]]
    assert handler.events == [("DELETED", "x"), ("ADDED", "y")]


def mirror_of(ledger: Ledger, client: FakeStatusClient, now: list[datetime]) -> StatusMirror:
    return StatusMirror(
        NodeSnapshot(ledger), client, lambda: None, qps=1000, burst=1000, resync_period=3600,  # type: ignore[arg-type]
        gpu_resource="nvidia.com/gpu", clock=lambda: now[0],
    )  # fmt: skip


def resync_writes(mirror: StatusMirror, client: FakeStatusClient) -> list[str]:
    """The nodes one resync wrote."""
    before = len(client.written)
    mirror.resync()
    mirror.flush(threading.Event())
    return sorted(client.written[before:])


def test_a_resync_writes_only_the_nodes_whose_figures_differ(ledger: Ledger) -> None:
    for name in ("a", "b", "c"):
        ledger.upsert_node(name, NodeSpec(capacity=Resources(16000, 32 * GIB)))
    client, now = FakeStatusClient("a", "b", "c"), [T0]
    mirror = mirror_of(ledger, client, now)
    assert resync_writes(mirror, client) == ["a", "b", "c"]  # new GenericNodes, no status yet
    now[0] = datetime(2026, 1, 2, tzinfo=UTC)
    assert resync_writes(mirror, client) == []  # nothing changed: nothing written
    ledger.admit("b", Holder(HolderKind.POD, "p1"), Resources(1000, GIB))
    client.objects["c"]["free"] = {"cpu": "1"}  # someone else changed c's status
    assert resync_writes(mirror, client) == ["b", "c"]
    assert resync_writes(mirror, client) == []
    # Kept across the rewrites: Ready never changed, so its transition time is the first.
    ready = {c["type"]: c for c in client.objects["b"]["conditions"]}["Ready"]
    assert ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert client.objects["b"]["lastSyncTime"] == "2026-01-02T00:00:00Z"


def test_a_resync_takes_transition_times_from_what_kubernetes_has(ledger: Ledger) -> None:
    ledger.upsert_node("a", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    client, now = FakeStatusClient("a"), [T0]
    resync_writes(mirror_of(ledger, client, now), client)
    # A restarted service (a new mirror, nothing written by it yet) changes nothing.
    now[0] = datetime(2026, 1, 3, tzinfo=UTC)
    assert resync_writes(mirror_of(ledger, client, now), client) == []
    # The node is cordoned: Ready flips, with a new transition time; the rest is kept.
    ledger.upsert_node("a", NodeSpec(capacity=Resources(16000, 32 * GIB)), cordon_reason="x")
    assert resync_writes(mirror_of(ledger, client, now), client) == ["a"]
    conditions = {c["type"]: c for c in client.objects["a"]["conditions"]}
    assert conditions["Ready"]["lastTransitionTime"] == "2026-01-03T00:00:00Z"
    assert conditions["SlurmSynced"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_a_status_write_that_fails_is_tried_again_on_the_next_pass(ledger: Ledger) -> None:
    ledger.upsert_node("a", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    client, now = FakeStatusClient("a"), [T0]
    mirror = mirror_of(ledger, client, now)
    resync_writes(mirror, client)
    write = client.patch_status

    def unavailable(path: str, status: dict[str, Any]) -> None:
        raise KubeError(f"PATCH {path}: 503 the API server is restarting", 503)

    client.patch_status = unavailable  # type: ignore[method-assign]
    ledger.admit("a", Holder(HolderKind.POD, "p1"), Resources(1000, GIB))
    mirror.mark(["a"])  # as the snapshot's refresh does for the running mirror
    with pytest.raises(KubeError):
        mirror.flush(threading.Event())
    client.patch_status = write  # type: ignore[method-assign]
    mirror.flush(threading.Event())  # no change and no resync in between: a is still marked
    assert client.objects["a"]["allocatedResources"][0]["allocated"]["cpu"] == "1"


def test_the_running_mirror_writes_the_nodes_the_snapshot_says_changed(ledger: Ledger) -> None:
    for name in ("a", "b"):
        ledger.upsert_node(name, NodeSpec(capacity=Resources(16000, 32 * GIB)))
    client, now = FakeStatusClient("a", "b"), [T0]
    mirror = mirror_of(ledger, client, now)
    stop = threading.Event()
    thread = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60  # generous: a busy machine
        while sorted(client.written) != ["a", "b"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(client.written) == ["a", "b"]  # the first resync
        ledger.admit("b", Holder(HolderKind.POD, "p1"), Resources(1000, GIB))
        while len(client.written) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.written[2:] == ["b"]  # told by the snapshot, not by a resync
        assert client.objects["b"]["free"]["cpu"] == "15"
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not mirror.snapshot._subscribers  # a mirror that stopped no longer listens


def test_the_mirror_writes_a_node_whose_headroom_alone_changed(ledger: Ledger) -> None:
    ledger.upsert_node("a", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    ledger.admit("a", Holder(HolderKind.POD, "p1"), Resources(1000, GIB))
    client, now = FakeStatusClient("a"), [T0]
    mirror = mirror_of(ledger, client, now)
    stop = threading.Event()
    thread = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60  # generous: a busy machine
        while client.written != ["a"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.written == ["a"]  # the first resync
        set_headroom(ledger, "a", target=Resources(2000, GIB), granted=Resources(3000, 2 * GIB))
        while len(client.written) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.written == ["a", "a"]  # told by the snapshot, not by a resync
        assert client.objects["a"]["headroom"] == {
            "target": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "0"},
            "granted": {"cpu": "3", "memory": "2Gi", "nvidia.com/gpu": "0"},
            "free": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "0"},
        }
    finally:
        stop.set()
        thread.join(timeout=10)


def test_status_writes_keep_to_the_rate(ledger: Ledger) -> None:
    for i in range(30):
        ledger.upsert_node(f"n{i}", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    client = FakeStatusClient(*(f"n{i}" for i in range(30)))
    mirror = StatusMirror(
        NodeSnapshot(ledger), client, lambda: None, qps=20, burst=10, resync_period=3600,  # type: ignore[arg-type]
        gpu_resource="nvidia.com/gpu", clock=lambda: T0,
    )  # fmt: skip
    started = time.monotonic()
    assert len(resync_writes(mirror, client)) == 30
    assert time.monotonic() - started >= (30 - 10) / 20 * 0.9  # the burst, then 20/s


class UnreachableElection:
    """LeaderElection against an API server that is not there: a connection error escapes
    run() at once (the client pauses only after API errors)."""

    runs = 0
    finished = False

    def __init__(self, config: Any) -> None:
        pass

    def run(self) -> None:
        if UnreachableElection.finished:
            raise SystemExit  # ends the elector's thread
        UnreachableElection.runs += 1
        raise ConnectionRefusedError("nothing listens there")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the end
def test_an_unreachable_api_server_is_retried_at_the_election_pace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="app.kube.controllers.leader")
    monkeypatch.setattr(leader.leaderelection, "LeaderElection", UnreachableElection)
    client = SimpleNamespace(api_client=None)
    elector = leader.LeaderElector(
        client, name="l", namespace="default", identity="me",  # type: ignore[arg-type]
        lease_duration=5, on_start=lambda: None, on_stop=lambda: None,
    )  # fmt: skip
    started = time.monotonic()
    elector.start()
    try:
        wait_until(lambda: UnreachableElection.runs >= 3, 60, what="three tries")
        # The retry period is 1 s: a third try comes no sooner than 2 s after the start
        # (a lower bound, which a busy machine cannot break; a pace-less loop would).
        assert time.monotonic() - started >= 2 * 0.9
        # One line for the outage, no traceback per retry.
        records = [r for r in caplog.records if r.name == "app.kube.controllers.leader"]
        assert [r.levelname for r in records if r.levelno >= logging.WARNING] == ["WARNING"]
        assert not any(r.exc_info for r in records)
    finally:
        UnreachableElection.finished = True
        elector._loop.stop(5)
