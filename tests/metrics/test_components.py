"""What the components count, each against a fake of what it talks to: the slurmrestd
client (httpx.MockTransport), the pusher, the sync, the Kubernetes list-and-watch."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from app.core.ledger_errors import AdmissionRejected, HolderConflict, NodeNotFound
from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.core.slurm_models import Listing, SlurmJob, SlurmNode
from app.kube.controllers.watch import ListWatch
from app.ledger.service import Ledger
from app.metrics.registry import (
    Metrics,
    admission_result,
    push_reason,
    slurm_endpoint,
)
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmAuthError, SlurmRequestError, SlurmUnavailable
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from app.slurm.sync import SlurmSync
from app.slurm.tokens import StaticToken
from tests.metrics.scrape import Scrape, parse
from tests.support.fake_kube import FakeWatchClient, Recorder
from tests.support.fake_slurm import LIMIT, NODE, OPENAPI, FakeSlurm, HeldSlurm, queued, slurm_node
from tests.support.realenv import wait_until

GIB = 2**30


def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def scraped(m: Metrics) -> Scrape:
    assert m.registry is not None
    return parse(generate_latest(m.registry).decode())


# ---------------------------------------------------------------------- classification


def _from_slurm() -> AdmissionRejected:
    try:
        raise SlurmUnavailable("slurmrestd GET node/n1 timed out")
    except SlurmUnavailable as exc:
        try:
            raise AdmissionRejected(f"Slurm cannot confirm the admission: {exc}") from exc
        except AdmissionRejected as rejected:
            return rejected


@pytest.mark.parametrize(
    ("exc", "phase", "result"),
    [
        (AdmissionRejected("insufficient resources"), "ledger", "rejected_ledger"),
        (HolderConflict("holds something else"), "ledger", "rejected_ledger"),
        (NodeNotFound("n9"), None, "rejected_ledger"),
        (AdmissionRejected("Slurm already holds it"), "slurm", "rejected_slurm"),
        (AdmissionRejected("over the Kubernetes share"), "slurm", "rejected_slurm"),
        (_from_slurm(), "slurm", "failed_closed"),
        (RuntimeError("gate broke"), "slurm", "failed_closed"),
        (NodeNotFound("n1"), "slurm", "rejected_ledger"),
        (RuntimeError("database down"), "ledger", None),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_admission_results(exc: Exception, phase: Any, result: str | None) -> None:
    assert admission_result(exc, phase) == result


@pytest.mark.parametrize(
    ("method", "path", "endpoint"),
    [
        ("GET", "/openapi/v3", "GET openapi"),
        ("GET", "/slurm/v0.0.42/nodes/", "GET nodes"),
        ("GET", "/slurm/v0.0.45/node/c17-gpu", "GET node"),
        ("POST", "/slurm/v0.0.42/node/c17-gpu", "POST node"),
        ("GET", "/slurm/v0.0.42/jobs/", "GET jobs"),
    ],
)
def test_slurm_endpoints_never_name_the_node(method: str, path: str, endpoint: str) -> None:
    assert slurm_endpoint(method, path) == endpoint


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        ("admitting ns/web-0", "admission"),
        ("holdings changed", "release"),
        ("released", "release"),
        ("drift", "drift"),
        ("retry", "retry"),
        ("ledger changed", "other"),
        ("something new", "other"),
    ],
)
def test_push_reasons_map_to_a_bounded_set(reason: str, label: str) -> None:
    assert push_reason(reason) == label


# ---------------------------------------------------------------------- Slurm


def test_slurm_requests_are_timed_per_endpoint_and_outcome() -> None:
    answers: dict[str, Any] = {
        "nodes/": httpx.Response(200, json={"nodes": [NODE], "last_update": 7}),
        "node/n1": httpx.Response(200, json={"nodes": [NODE]}),
        "jobs/": httpx.Response(401),
    }
    fail_post = [True]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi/v3":
            return httpx.Response(200, json=OPENAPI)
        rest = request.url.path.split("/", 3)[-1]
        if request.method == "POST":
            if fail_post[0]:
                fail_post[0] = False
                raise httpx.ConnectError("refused")
            return httpx.Response(400, json={"errors": [{"error_number": 2017, "error": "x"}]})
        answer: httpx.Response = answers[rest]
        return answer

    m = metrics()
    client = SlurmClient(
        "http://slurm", StaticToken("t"), transport=httpx.MockTransport(handler), metrics=m
    )
    client.get_nodes()
    client.get_node("n1")
    with pytest.raises(SlurmAuthError):
        client.get_jobs()
    with pytest.raises(SlurmRequestError):
        client.update_node("n1", gres="k8scpu:3")  # refused once unreachable, then an error

    s = scraped(m)
    count = "nodeledger_slurm_request_duration_seconds_count"
    assert {tuple(sorted(dict(k).values())) for k in s.series(count)} == {
        ("GET openapi", "ok"),
        ("GET nodes", "ok"),
        ("GET node", "ok"),
        ("GET jobs", "auth"),
        ("POST node", "unavailable"),
        ("POST node", "error"),
    }
    assert s.value(count, endpoint="POST node", outcome="unavailable") == 1  # each attempt
    assert "n1" not in {v for k in s.series(count) for _, v in k}


class StepSlurm(FakeSlurm):
    """A slurmrestd for the sync: the node, no jobs, and a switch to make it unreachable."""

    def __init__(self, node: SlurmNode) -> None:
        super().__init__(node, latency=0)
        self.down = False

    def get_nodes(self, update_time: int | None = None) -> Listing[SlurmNode]:
        if self.down:
            raise SlurmUnavailable("slurmrestd GET nodes/: unreachable")
        return Listing((self.get_node("n1"),), 1)

    def get_jobs(self, update_time: int | None = None) -> Listing[SlurmJob]:
        return Listing((), 1)


def test_sync_reports_freshness_leadership_and_drift(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    clock = [100.0]
    m = Metrics(CollectorRegistry(), monotonic=lambda: clock[0])
    slurm = StepSlurm(slurm_node(gres="k8scpu:3,k8smemory:32000"))  # lost counts: drift
    pusher = Pusher(slurm, ledger, metrics=m)  # type: ignore[arg-type]
    sync = SlurmSync(slurm, ledger, pusher, holds=HoldJobs(slurm), metrics=m)  # type: ignore[arg-type]
    assert scraped(m).value("nodeledger_slurm_up") == 0  # built, not synced yet
    clock[0] = 103.0
    assert scraped(m).value("nodeledger_slurm_staleness_seconds") == 3

    sync.step()
    s = scraped(m)
    assert s.value("nodeledger_slurm_up") == 1
    assert s.value("nodeledger_slurm_staleness_seconds") == 0
    assert s.value("nodeledger_leader", role="slurm-sync") == 1  # no rival replica
    assert s.value("nodeledger_slurm_drifted_nodes") == 1
    assert s.value("nodeledger_slurm_pushes_total", reason="drift") == 1
    assert slurm.node.gres == "k8scpu:16,k8smemory:32000"

    slurm.down, clock[0] = True, 110.0
    sync.step()
    s = scraped(m)
    assert s.value("nodeledger_slurm_up") == 0
    assert s.value("nodeledger_slurm_staleness_seconds") == 7
    slurm.down = False
    sync.step()
    assert scraped(m).value("nodeledger_slurm_drifted_nodes") == 0


def test_a_drift_correction_is_counted_when_slurm_lost_what_was_pushed(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    m = metrics()
    slurm = StepSlurm(slurm_node())
    pusher = Pusher(slurm, ledger, metrics=m)  # type: ignore[arg-type]
    sync = SlurmSync(slurm, ledger, pusher, holds=HoldJobs(slurm), metrics=m)  # type: ignore[arg-type]
    ledger.admit("n1", Holder(HolderKind.POD, "u1"), Resources(2000, GIB))
    pusher.push("n1", reason="admitting u1")
    slurm.node = slurm_node()  # slurmctld restarted: counts back to full
    sync.step()
    assert scraped(m).value("nodeledger_slurm_drift_corrections_total") == 1


def test_coalesced_pushes_are_counted(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    m = metrics()
    slurm = HeldSlurm(slurm_node())
    pusher = Pusher(slurm, ledger, metrics=m)  # type: ignore[arg-type]
    with ThreadPoolExecutor(max_workers=8) as pool:
        done = [pool.submit(pusher.push, "n1", reason="admitting x")]
        assert slurm.entered.wait(LIMIT), "the first push never reached Slurm"
        # Seven more line up behind the push in flight, overlapping by construction.
        done += [pool.submit(pusher.push, "n1", reason="admitting x") for _ in range(7)]
        wait_until(lambda: queued(pusher, "n1") == 8, LIMIT, what="8 pushes asked for")
        slurm.release.set()
        for future in done:
            future.result()
    s = scraped(m)
    # The first push read the ledger before the others asked; the next one read it after
    # all of them, so it answers the six still waiting.
    assert s.value("nodeledger_slurm_pushes_total", reason="admission") == 2
    assert s.value("nodeledger_slurm_pushes_coalesced_total") == 6


# ---------------------------------------------------------------------- Kubernetes


def test_a_watch_that_broke_off_counts_a_restart_and_a_relist() -> None:
    m = metrics()
    stop = threading.Event()
    watch = ListWatch("pods", FakeWatchClient(), "/pods", Recorder(stop), metrics=m)  # type: ignore[arg-type]
    assert scraped(m).has("nodeledger_kube_relists_total", watch="pods")  # zero from the start
    watch.run(stop)  # 410 Gone on the first watch, then an event that stops it
    s = scraped(m)
    assert s.value("nodeledger_kube_watch_restarts_total", watch="pods") == 1
    assert s.value("nodeledger_kube_relists_total", watch="pods") == 1
