"""Pod accounting against a real ledger: a resync writes only what the ledger does not
already have, sweeps release holdings whose pod is not bound, once past the grace, a pod
resized in place grows only by an admission, and a pod gone while its node is lost keeps
its holding until a proof (issue 34)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from app.admission.service import AdmissionRequest, Admissions, ReleaseRequest
from app.core.caps import KubeCaps
from app.core.ledger_errors import AdmissionRejected
from app.core.pod_release import NodeHealth
from app.core.records import (
    EventKind,
    HeldDevice,
    Holder,
    HolderKind,
    Holding,
    NodeSpec,
    Recorded,
    Recording,
    SnapshotEntry,
)
from app.core.resources import Resources
from app.db.engine import Database
from app.kube.controllers.accounting import RECORD_BATCH, RESIZE_NOT_ADMITTED, PodAccounting
from app.ledger.service import Ledger
from app.metrics.registry import Metrics
from app.slurm.gate import SlurmGate
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from tests.metrics.scrape import parse
from tests.support.fake_slurm import FakeSlurm, slurm_node
from tests.support.pod_accounting import GIB, pod, reporting, running
from tests.support.slurm_cluster import k8s_counts

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(database: Database, clock: Clock) -> Ledger:
    ledger = Ledger(database, clock=clock)
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    return ledger


@pytest.fixture
def accounting(ledger: Ledger, clock: Clock) -> PodAccounting:
    return PodAccounting(
        Admissions(ledger), {"n1"}.__contains__, gpu_resource="nvidia.com/gpu",
        binding_grace=30, clock=clock,
    )  # fmt: skip


def pod_holdings(ledger: Ledger) -> dict[str, int]:
    return {h.holder.id: h.resources.cpu_millis for h in ledger.list_holdings(kind=HolderKind.POD)}


def writes_since(ledger: Ledger, event_id: int) -> list[str]:
    """Holders whose holding an event after ``event_id`` recorded or released."""
    kinds = {EventKind.ADMITTED, EventKind.RELEASED}
    return [
        f"{e.kind.value} {e.holder_id}"
        for e in ledger.events(after_id=event_id, limit=1000)
        if e.kind in kinds
    ]


def test_a_resync_records_only_what_the_ledger_does_not_have(
    ledger: Ledger, accounting: PodAccounting
) -> None:
    accounting.resync([pod("same"), pod("resized"), pod("elsewhere", node="other")])
    mark = ledger.last_event_id()
    accounting.resync([pod("same"), pod("resized", cpu=2000), pod("new")])
    # The new pod recorded; the resized one's growth admitted, then joined to its holding.
    assert writes_since(ledger, mark) == [
        "admitted new", "admitted resized+resize", "admitted resized"
    ]  # fmt: skip
    assert pod_holdings(ledger) == {"same": 1000, "resized": 2000, "new": 1000}
    mark = ledger.last_event_id()
    accounting.resync([pod("same"), pod("resized", cpu=2000), pod("new")])
    assert writes_since(ledger, mark) == []  # nothing changed: no transaction at all


def test_sweeps_release_unbound_holdings_once_past_the_grace(
    ledger: Ledger, accounting: PodAccounting, clock: Clock
) -> None:
    admissions = accounting.admissions
    admissions.admit(AdmissionRequest("n1", Holder(HolderKind.POD, "gone"), Resources(1000, GIB)))
    clock.advance(60)
    admissions.admit(
        AdmissionRequest("n1", Holder(HolderKind.POD, "admitted"), Resources(1000, GIB))
    )
    accounting.resync([pod("bound")])
    # The holding of a pod that is not there went; the fresh admission waits for its pod.
    assert set(pod_holdings(ledger)) == {"bound", "admitted"}
    clock.advance(20)
    accounting.sweep()
    assert set(pod_holdings(ledger)) == {"bound", "admitted"}
    clock.advance(20)  # 40 s old: its pod was never bound
    accounting.sweep()
    assert set(pod_holdings(ledger)) == {"bound"}


def test_a_holding_whose_pod_was_bound_in_time_is_kept(
    ledger: Ledger, accounting: PodAccounting, clock: Clock
) -> None:
    accounting.resync([])
    accounting.admissions.admit(
        AdmissionRequest("n1", Holder(HolderKind.POD, "p"), Resources(1000, GIB))
    )
    clock.advance(5)
    accounting.on_event("ADDED", pod("p"))  # the scheduler bound it
    clock.advance(60)
    accounting.sweep()
    assert set(pod_holdings(ledger)) == {"p"}
    accounting.on_event("MODIFIED", pod("p", phase="Succeeded"))
    assert pod_holdings(ledger) == {}


def test_no_sweep_before_the_first_resync(
    ledger: Ledger, accounting: PodAccounting, clock: Clock
) -> None:
    accounting.admissions.admit(
        AdmissionRequest("n1", Holder(HolderKind.POD, "p"), Resources(1000, GIB))
    )
    clock.advance(60)
    accounting.sweep()  # the pods are not listed yet: "not bound" would be a guess
    assert set(pod_holdings(ledger)) == {"p"}


def test_a_cold_resync_records_in_batches(
    ledger: Ledger, accounting: PodAccounting, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    record_many = ledger.record_many

    def counted(entries: Sequence[Recording], *, reason: str) -> Recorded:
        calls.append(len(entries))
        return record_many(entries, reason=reason)

    monkeypatch.setattr(ledger, "record_many", counted)
    accounting.resync([pod(f"p{i}", cpu=10) for i in range(1200)])
    assert calls == [RECORD_BATCH, RECORD_BATCH, 1200 - 2 * RECORD_BATCH]
    assert len(pod_holdings(ledger)) == 1200


# In-place resize: a growth is an admission of the difference; until then the holding is
# the larger of the old one and what the kubelet allocated; a shrink goes at once.


class _Gate:
    """Slurm's answer to each confirmation: refuse while ``refusing``."""

    def __init__(self) -> None:
        self.refusing: str | None = None
        self.confirmed: list[Resources] = []

    def confirm(self, holding: Holding) -> str | None:
        if self.refusing:
            raise AdmissionRejected(self.refusing)
        self.confirmed.append(holding.resources)
        return None

    def changed(self, node: str) -> None:
        """Nothing to push."""

    def headroom_open(self, node: str) -> bool:
        return False

    def released(self, holding: Holding) -> None:
        """No hold job."""

    def defer_push(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        """No headroom."""


@pytest.fixture
def gate() -> _Gate:
    return _Gate()


@pytest.fixture
def reports() -> list[tuple[str, str, str]]:
    return []


@pytest.fixture
def resizing(
    ledger: Ledger, clock: Clock, gate: _Gate, reports: list[tuple[str, str, str]]
) -> PodAccounting:
    return reporting(Admissions(ledger, gate), clock, reports)


def job(ledger: Ledger, cpu: int) -> None:
    """A Slurm job on n1 using ``cpu`` (as the Slurm sync records it; 0: it ended)."""
    jobs = {"7": SnapshotEntry("job 7", Resources(cpu, GIB))} if cpu else {}
    ledger.replace_holdings("n1", HolderKind.SLURM_JOB, jobs)


@pytest.mark.parametrize("via", ["watch", "resync"])
def test_a_growth_that_does_not_fit_is_not_held_and_is_admitted_once_it_fits(
    ledger: Ledger,
    resizing: PodAccounting,
    gate: _Gate,
    reports: list[tuple[str, str, str]],
    via: str,
) -> None:
    """A 12-CPU job and a 4-CPU pod on 16 CPUs, the pod resized to 8: held at 4 (what it
    had and what its kubelet allocated), told once on the pod; once the job ends, the
    sweep admits the growth, confirmed by Slurm."""
    job(ledger, 12000)
    resizing.on_event("ADDED", running("p", 4000, 4000))
    grown = running("p", 8000, 4000)  # the kubelet defers it
    if via == "watch":
        resizing.on_event("MODIFIED", grown)
    else:
        resizing.resync([grown])
    assert pod_holdings(ledger) == {"p": 4000}
    ((uid, reason, message),) = reports
    assert (uid, reason) == ("p", RESIZE_NOT_ADMITTED)
    assert "cpu: requested 4, free 0" in message, message
    resizing.on_event("MODIFIED", grown)  # the next status update: not told again
    resizing.sweep()  # no room yet: not tried
    assert len(reports) == 1
    assert pod_holdings(ledger) == {"p": 4000}
    job(ledger, 0)
    resizing.sweep()
    assert pod_holdings(ledger) == {"p": 8000}
    assert gate.confirmed[-1] == Resources(4000, 0)  # the difference, confirmed by Slurm


def test_slurm_refusing_a_growth_leaves_the_holding_as_it_was(
    ledger: Ledger, resizing: PodAccounting, gate: _Gate, reports: list[tuple[str, str, str]]
) -> None:
    resizing.on_event("ADDED", running("p", 4000, 4000))
    gate.refusing = "Slurm already holds it on node n1: cpu"
    resizing.on_event("MODIFIED", running("p", 8000, 4000))
    assert pod_holdings(ledger) == {"p": 4000}
    assert "Slurm already holds it" in reports[0][2]
    gate.refusing = None
    resizing.sweep()  # the ledger has room: tried again
    assert pod_holdings(ledger) == {"p": 8000}


def test_what_the_kubelet_allocated_is_held_and_a_shrink_goes_when_it_is_applied(
    ledger: Ledger, resizing: PodAccounting, reports: list[tuple[str, str, str]]
) -> None:
    """A kubelet that applied a growth on its own count (placeholders off): recorded as it
    runs, overcommitting the node; a shrink is held until the kubelet applied it."""
    job(ledger, 12000)
    resizing.on_event("ADDED", running("p", 4000, 4000))
    resizing.on_event("MODIFIED", running("p", 8000, 8000))
    assert pod_holdings(ledger) == {"p": 8000}
    assert not reports
    resizing.on_event("MODIFIED", running("p", 2000, 8000))  # asked, not applied yet
    assert pod_holdings(ledger) == {"p": 8000}
    resizing.on_event("MODIFIED", running("p", 2000, 2000))
    assert pod_holdings(ledger) == {"p": 2000}
    resizing.on_event("MODIFIED", running("p", 1000, None))  # nothing reported: at once
    assert pod_holdings(ledger) == {"p": 1000}


def test_a_growth_onto_cpus_a_job_uses_is_refused_by_slurms_read_back(
    ledger: Ledger, clock: Clock, reports: list[tuple[str, str, str]]
) -> None:
    """The real gate, on a fake slurmrestd whose node runs a 12-CPU job the ledger has not
    seen yet: the pod's growth from 4 to 8 CPUs fits the ledger, the push of its counts
    reads the job back, and the growth is undone; the counts withhold the pod's 4 again."""
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    fake = FakeSlurm(slurm_node(gres_used="k8scpu:12,k8smemory:1000"))
    gate = SlurmGate(Pusher(fake, ledger), KubeCaps(), holds=HoldJobs(fake))  # type: ignore[arg-type]
    accounting = reporting(Admissions(ledger, gate), clock, reports)
    accounting.on_event("ADDED", running("p", 4000, 4000))
    accounting.on_event("MODIFIED", running("p", 8000, 4000))
    assert pod_holdings(ledger) == {"p": 4000}
    assert "Slurm already holds it on node n1" in reports[0][2], reports
    assert k8s_counts(fake.node.gres)["k8scpu"] == 12


def test_a_resize_keeps_the_holdings_devices(ledger: Ledger, resizing: PodAccounting) -> None:
    """A pod holding GPU devices (the extender's bind): resized where it stands, its
    devices and GPUs kept (the API server resizes CPU and memory only)."""
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32 * GIB, 2)))
    holder = Holder(HolderKind.POD, "g", "ns/g")
    resizing.admissions.admit(
        AdmissionRequest("n1", holder, Resources(1000, GIB, 1), devices=(HeldDevice(0),))
    )
    resizing.on_event("ADDED", running("g", 2000, 1000))
    (held,) = ledger.holdings_of(HolderKind.POD, ["g"])
    assert (held.resources, held.device_indices) == (Resources(2000, GIB, 1), (0,))


# Lost kubelets (issue 34): a pod deleted while its node is not Ready keeps its holding until
# a proof that its containers stopped; the release event names the proof.

LOST = NodeHealth(ready=False)


@pytest.fixture
def nodes() -> dict[str, NodeHealth]:
    """The managed Nodes' health, as discovery would tell it (a Node absent: deleted)."""
    return {"n1": NodeHealth(ready=True)}


@pytest.fixture
def watched(ledger: Ledger, clock: Clock, nodes: dict[str, NodeHealth]) -> PodAccounting:
    accounting = PodAccounting(
        Admissions(ledger), nodes.__contains__, gpu_resource="nvidia.com/gpu",
        binding_grace=30, clock=clock, node_health=nodes.get, metrics=Metrics(CollectorRegistry()),
    )  # fmt: skip
    accounting.resync([])
    return accounting


def releases_since(ledger: Ledger, event_id: int) -> list[str]:
    return [
        f"{e.holder_id}: {e.message}"
        for e in ledger.events(after_id=event_id, limit=1000)
        if e.kind is EventKind.RELEASED
    ]


def orphaned(accounting: PodAccounting) -> float:
    """The gauge, as scraped."""
    registry = accounting.metrics.registry
    assert registry is not None
    return parse(generate_latest(registry).decode()).value("nodeledger_kube_orphaned_pod_holdings")


def test_a_pod_deleted_on_a_ready_node_is_released_as_before(
    ledger: Ledger, watched: PodAccounting
) -> None:
    watched.on_event("ADDED", pod("p", phase="Running"))
    mark = ledger.last_event_id()
    watched.on_event("DELETED", pod("p", phase="Running"))
    assert releases_since(ledger, mark) == [
        "p: pod finished or deleted; proof: pod-deleted-node-ready"
    ]


def test_a_pod_finished_on_a_lost_node_is_released(
    ledger: Ledger, watched: PodAccounting, nodes: dict[str, NodeHealth]
) -> None:
    watched.on_event("ADDED", pod("p", phase="Running"))
    nodes["n1"] = LOST
    mark = ledger.last_event_id()
    watched.on_event("MODIFIED", pod("p", phase="Failed"))
    assert releases_since(ledger, mark) == ["p: pod finished or deleted; proof: pod-terminal"]


def test_a_pod_force_deleted_on_a_lost_node_keeps_its_holding_until_the_taint(
    ledger: Ledger, watched: PodAccounting, nodes: dict[str, NodeHealth]
) -> None:
    watched.on_event("ADDED", pod("p", phase="Running"))
    watched.on_event("ADDED", pod("q", phase="Running"))
    nodes["n1"] = LOST
    mark = ledger.last_event_id()
    watched.on_event("DELETED", pod("p", phase="Running"))  # kubectl delete --force
    assert set(pod_holdings(ledger)) == {"p", "q"}
    assert orphaned(watched) == 1
    watched.sweep()
    watched.nodes_changed(["n1"])  # nothing that proves anything yet
    assert releases_since(ledger, mark) == []
    nodes["n1"] = NodeHealth(ready=False, out_of_service=True)
    watched.nodes_changed(["n1"])
    assert releases_since(ledger, mark) == ["p: orphaned pod holding; proof: out-of-service-taint"]
    assert set(pod_holdings(ledger)) == {"q"}  # the pod still in the API still holds
    assert orphaned(watched) == 0


@pytest.mark.parametrize(
    ("node", "proof"),
    [(None, "node-deleted"), (NodeHealth(ready=True), "kubelet-returned")],
    ids=["node-deleted", "kubelet-returned"],
)
def test_an_orphaned_holding_goes_with_its_node_or_its_kubelets_return(
    ledger: Ledger,
    watched: PodAccounting,
    nodes: dict[str, NodeHealth],
    node: NodeHealth | None,
    proof: str,
) -> None:
    watched.on_event("ADDED", pod("p", phase="Running"))
    nodes["n1"] = LOST
    watched.on_event("DELETED", pod("p", phase="Running"))
    mark = ledger.last_event_id()
    if node is None:
        del nodes["n1"]
    else:
        nodes["n1"] = node
    watched.nodes_changed(["n1"])
    assert releases_since(ledger, mark) == [f"p: orphaned pod holding; proof: {proof}"]


def test_a_pod_whose_containers_were_reported_stopped_is_released_on_a_lost_node(
    ledger: Ledger, watched: PodAccounting, nodes: dict[str, NodeHealth]
) -> None:
    watched.on_event("ADDED", pod("p", phase="Running"))
    nodes["n1"] = LOST
    mark = ledger.last_event_id()
    watched.on_event("DELETED", replace(pod("p", phase="Running"), stopped=True))
    assert releases_since(ledger, mark) == ["p: pod finished or deleted; proof: containers-stopped"]
    assert orphaned(watched) == 0


def test_a_missed_node_change_is_caught_by_the_next_sweep(
    ledger: Ledger, watched: PodAccounting, nodes: dict[str, NodeHealth]
) -> None:
    watched.on_event("ADDED", pod("p", phase="Running"))
    nodes["n1"] = LOST
    watched.on_event("DELETED", pod("p", phase="Running"))
    mark = ledger.last_event_id()
    nodes["n1"] = NodeHealth(ready=False, out_of_service=True)  # the hook was not called
    watched.sweep()
    assert releases_since(ledger, mark) == ["p: orphaned pod holding; proof: out-of-service-taint"]


def test_after_a_restart_resync_and_sweeps_keep_holdings_on_a_lost_node(
    ledger: Ledger, clock: Clock, nodes: dict[str, NodeHealth]
) -> None:
    """The service was down while the pods were force-deleted: nothing lists them now."""
    admissions = Admissions(ledger)
    ledger.upsert_node("n2", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    nodes["n2"] = LOST
    admissions.record("n1", Holder(HolderKind.POD, "on-ready"), Resources(1000, GIB), reason="x")
    admissions.record("n2", Holder(HolderKind.POD, "on-lost"), Resources(1000, GIB), reason="x")
    clock.advance(60)
    admissions.record("n2", Holder(HolderKind.POD, "young"), Resources(1000, GIB), reason="x")
    mark = ledger.last_event_id()
    restarted = PodAccounting(
        admissions, nodes.__contains__, gpu_resource="nvidia.com/gpu",
        binding_grace=30, clock=clock, node_health=nodes.get, metrics=Metrics(CollectorRegistry()),
    )  # fmt: skip
    restarted.resync([])
    assert releases_since(ledger, mark) == [
        "on-ready: no such bound pod; proof: pod-deleted-node-ready"
    ]
    clock.advance(60)  # "young" comes of age: the periodic sweep looks at it
    restarted.sweep()
    restarted.resync([])  # the periodic resync, too
    assert set(pod_holdings(ledger)) == {"on-lost", "young"}
    assert orphaned(restarted) == 2
    mark = ledger.last_event_id()
    del nodes["n2"]
    restarted.nodes_changed(["n2"])
    assert sorted(releases_since(ledger, mark)) == [
        "on-lost: orphaned pod holding; proof: node-deleted",
        "young: orphaned pod holding; proof: node-deleted",
    ]
    assert orphaned(restarted) == 0


def test_an_orphaned_holding_released_by_hand_is_forgotten_at_the_next_resync(
    ledger: Ledger, watched: PodAccounting, nodes: dict[str, NodeHealth]
) -> None:
    watched.on_event("ADDED", pod("p", phase="Running"))
    nodes["n1"] = LOST
    watched.on_event("DELETED", pod("p", phase="Running"))
    watched.admissions.release(ReleaseRequest("p", HolderKind.POD, reason="an operator"))
    assert orphaned(watched) == 1
    watched.resync([])
    assert orphaned(watched) == 0
