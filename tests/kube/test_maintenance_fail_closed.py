"""Issue 34, item 5: the maintenance reconciler fails closed. While the Kubernetes API or
slurmrestd does not answer, no drain, resume, taint or untaint is guessed; what was pending
is applied once both answer. And item 3: the nodes whose two sides disagree, as metrics.

The real reconciler, Slurm sync, SlurmDrains, node snapshot and SQLite ledger; fakes only
at the two APIs, each of which can be switched off (connection refused) and on again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from app.core.maintenance import CORDONED, REASON_ANNOTATION, TAINT_KEY
from app.core.records import EventKind, NodeSpec
from app.core.resources import Resources
from app.core.slurm_models import Listing, SlurmJob, SlurmNode
from app.kube.client import KubeError
from app.kube.controllers.maintenance import Maintenance
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import Metrics
from app.slurm.drains import SlurmDrains
from app.slurm.errors import SlurmError, SlurmRequestError, SlurmUnavailable
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from app.slurm.sync import SlurmSync
from tests.support.fake_slurm import FakeSlurm, NodeUpdate, slurm_node

T0 = datetime(2026, 11, 27, 1, 40, tzinfo=UTC)
OTHERS = {"key": "example.com/rack", "value": "7", "effect": "NoSchedule"}


class Slurmrestd(FakeSlurm):
    """One Slurm node n1; every call refused while ``down``."""

    def __init__(self) -> None:
        super().__init__(slurm_node(), latency=0)
        self.down = False
        self.reads_down = False  # only its reads time out (a slurmctld too busy to list)
        self.state_updates: list[str] = []

    def _answer(self, what: str) -> None:
        if self.down or (self.reads_down and what.startswith("GET")):
            raise SlurmUnavailable(f"slurmrestd {what}: slurmrestd unreachable")

    def get_node(self, name: str) -> SlurmNode:
        self._answer(f"GET node/{name}")
        if name != "n1":
            raise SlurmRequestError(f"Slurm has no node {name!r}")
        return super().get_node(name)

    def get_nodes(self, update_time: int | None = None) -> Listing[SlurmNode]:
        self._answer("GET nodes/")
        return Listing((super().get_node("n1"),), 1)

    def get_jobs(self, update_time: int | None = None) -> Listing[SlurmJob]:
        self._answer("GET jobs/")
        return Listing((), 1)

    def before_update(self, name: str, update: NodeUpdate) -> None:
        self._answer(f"POST node/{name}")

    def store(self, name: str, update: NodeUpdate) -> None:
        super().store(name, update)
        if update.state == "DRAIN":
            self.drain(update.reason or "")
        elif update.state == "RESUME":
            self.resume()
        if update.state is not None:
            self.state_updates.append(update.state)

    def drain(self, reason: str) -> None:
        """As ``scontrol update state=drain`` (an administrator, or the service)."""
        self.node = replace(self.node, states=frozenset({"IDLE", "DRAIN"}), reason=reason)

    def resume(self) -> None:
        self.node = replace(self.node, states=frozenset({"IDLE"}), reason="")


class KubeApi:
    """The Node n1, read and merge-patched as the API server does; every call refused
    while ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.version = 1
        self.node: dict[str, Any] = {
            "metadata": {"name": "n1", "annotations": {}},
            "spec": {"taints": [OTHERS]},
        }
        self.patches = 0

    def _answer(self) -> None:
        if self.down:
            raise KubeError("Kubernetes API unreachable: connection refused")

    def _current(self) -> dict[str, Any]:
        node = copy.deepcopy(self.node)
        node["metadata"]["resourceVersion"] = str(self.version)
        return node

    def list(self, path: str, decode: Callable[[dict[str, Any]], Any], **query: Any) -> Any:
        self._answer()
        return [decode(self._current())], str(self.version)

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self._answer()
        if method == "GET":
            return self._current()
        body = kwargs["body"]
        if body["metadata"]["resourceVersion"] != str(self.version):
            raise KubeError("conflict", 409)
        self.node["spec"]["taints"] = body["spec"]["taints"]
        annotations = self.node["metadata"]["annotations"]
        for key, value in body["metadata"]["annotations"].items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        self.version += 1
        self.patches += 1
        return self._current()

    def ours(self) -> list[dict[str, Any]]:
        return [t for t in self.node["spec"]["taints"] if t["key"] == TAINT_KEY]


@dataclass
class World:
    ledger: Ledger
    slurm: Slurmrestd
    kube: KubeApi
    sync: SlurmSync
    maintenance: Maintenance
    metrics: Metrics
    cordoned: dict[str, bool] = field(default_factory=dict)  # discovery's watch
    now: list[float] = field(default_factory=lambda: [0.0])

    def cordon(self, cordoned: bool) -> None:
        """The Node watch delivers a cordon or an uncordon (as discovery tells)."""
        self.cordoned["n1"] = cordoned
        self.maintenance.mark(["n1"])

    def settle(self, passes: int = 3) -> list[Exception]:
        """Slurm sync steps and reconciler passes, as their loops run them; the errors the
        reconciler's passes raised (its loop logs them and goes on)."""
        errors: list[Exception] = []
        for _ in range(passes):
            self.now[0] += 1
            self.sync.step()
            try:
                self.maintenance.step()
            except (KubeError, SlurmError) as exc:
                errors.append(exc)
        return errors

    def health(self) -> str | None:
        return self.ledger.get_node("n1").health_reason

    def events(self) -> list[str]:
        return [e.message for e in self.ledger.events(kind=EventKind.MAINTENANCE, limit=100)]

    def gauge(self, name: str) -> float:
        registry = self.metrics.registry
        assert registry is not None
        value = registry.get_sample_value(name)
        assert value is not None
        return value


def make_world(ledger: Ledger, *, slurm_taints: bool = True, co_managed: bool = True) -> World:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    slurm, kube = Slurmrestd(), KubeApi()
    snapshot = NodeSnapshot(ledger)
    pusher = Pusher(slurm, ledger)  # type: ignore[arg-type]
    sync = SlurmSync(slurm, ledger, pusher, holds=HoldJobs(slurm), views=snapshot)  # type: ignore[arg-type]
    metrics = Metrics(CollectorRegistry())
    cordoned: dict[str, bool] = {}
    now = [0.0]
    maintenance = Maintenance(
        snapshot,
        kube,  # type: ignore[arg-type]
        lambda name: name in ledger.node_specs(),
        lambda name: cordoned.get(name, False),
        SlurmDrains(slurm),  # type: ignore[arg-type]
        lambda: T0,
        ledger.record_event,
        slurm_taints=slurm_taints,
        evict=False,
        node_selector="",
        resync_period=3600,
        co_managed=co_managed,
        metrics=metrics,
        monotonic=lambda: now[0],
    )
    snapshot.subscribe(maintenance.mark)
    world = World(ledger, slurm, kube, sync, maintenance, metrics, cordoned, now)
    assert world.settle() == []
    assert world.kube.ours() == []
    assert world.health() is None
    return world


@pytest.fixture
def world(ledger: Ledger) -> World:
    return make_world(ledger)


# ---------------------------------------------------------------- Slurm -> Kubernetes


def test_a_slurm_drain_is_tainted_once_the_kubernetes_api_answers(world: World) -> None:
    world.kube.down = True
    world.slurm.drain("hw check")
    errors = world.settle()
    assert errors
    assert all(isinstance(e, KubeError) for e in errors)
    assert world.health() == "Slurm node n1 is DRAIN+IDLE: hw check"  # the sync saw it
    assert world.kube.ours() == []
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 1

    world.kube.down = False
    assert world.settle() == []
    assert world.kube.ours() == [{"key": TAINT_KEY, "value": "DRAIN", "effect": "NoSchedule"}]
    assert world.kube.node["spec"]["taints"][0] == OTHERS
    assert world.slurm.state_updates == []  # nothing done to Slurm
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 0


def tainted(world: World) -> None:
    world.slurm.drain("hw check")
    assert world.settle() == []
    assert len(world.kube.ours()) == 1


def test_a_slurm_resume_is_untainted_once_the_kubernetes_api_answers(world: World) -> None:
    tainted(world)
    world.kube.down = True
    world.slurm.resume()
    assert world.settle()
    assert world.health() is None
    assert len(world.kube.ours()) == 1  # no untaint without the API

    world.kube.down = False
    assert world.settle() == []
    assert world.kube.ours() == []
    assert REASON_ANNOTATION not in world.kube.node["metadata"]["annotations"]
    assert world.kube.node["spec"]["taints"] == [OTHERS]


def test_slurm_unreachable_lifts_no_taint_and_a_resume_is_untainted_once_it_answers(
    world: World,
) -> None:
    tainted(world)
    patches = world.kube.patches
    world.slurm.down = True
    world.slurm.resume()  # unseen: slurmrestd does not answer
    world.settle(5)
    assert world.health() == "Slurm node n1 is DRAIN+IDLE: hw check"  # as last read
    assert len(world.kube.ours()) == 1
    assert world.kube.patches == patches
    world.maintenance.resync()  # a resync during the outage: nothing guessed either
    world.settle()
    assert len(world.kube.ours()) == 1

    world.slurm.down = False
    assert world.settle() == []
    assert world.kube.ours() == []


def test_slurm_unreachable_adds_no_taint_and_a_drain_is_tainted_once_it_answers(
    world: World,
) -> None:
    world.slurm.down = True
    world.slurm.drain("hw check")
    world.settle(5)
    assert world.health() is None
    assert world.kube.ours() == []

    world.slurm.down = False
    assert world.settle() == []
    assert len(world.kube.ours()) == 1


# ---------------------------------------------------------------- Kubernetes -> Slurm


def test_a_cordon_drains_slurm_once_slurmrestd_answers(world: World) -> None:
    world.slurm.down = True
    world.cordon(True)
    errors = world.settle(5)
    assert errors
    assert all(isinstance(e, SlurmError) for e in errors)
    assert world.slurm.state_updates == []
    assert world.events() == []
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 1
    assert world.gauge("nodeledger_maintenance_oldest_disagreement_seconds") == 4

    world.slurm.down = False
    assert world.settle() == []
    assert world.slurm.state_updates == ["DRAIN"]
    assert world.slurm.node.reason.startswith(CORDONED)
    assert world.kube.ours() == []  # the service's own drain: no taint
    assert [m for m in world.events() if m.startswith("Slurm node n1 drained")]
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 0
    assert world.gauge("nodeledger_maintenance_oldest_disagreement_seconds") == 0


def drained_for_a_cordon(world: World) -> None:
    world.cordon(True)
    assert world.settle() == []
    assert world.slurm.state_updates == ["DRAIN"]


def test_an_uncordon_resumes_slurm_once_slurmrestd_answers(world: World) -> None:
    drained_for_a_cordon(world)
    world.slurm.down = True
    world.cordon(False)
    assert world.settle(5)
    assert world.slurm.state_updates == ["DRAIN"]  # no resume without a read of Slurm

    world.slurm.down = False
    assert world.settle() == []
    assert world.slurm.state_updates == ["DRAIN", "RESUME"]
    assert world.kube.ours() == []
    assert "Slurm node n1 resumed: the Node was uncordoned" in world.events()


def test_a_failed_read_of_slurm_is_no_licence_to_resume(world: World) -> None:
    drained_for_a_cordon(world)
    world.slurm.drain("bad DIMM")  # an administrator's, unseen: reads fail from now on
    world.slurm.reads_down = True
    world.cordon(False)
    assert world.settle(5)
    assert world.slurm.state_updates == ["DRAIN"]
    assert world.slurm.node.reason == "bad DIMM"

    world.slurm.reads_down = False
    assert world.settle() == []
    assert world.slurm.state_updates == ["DRAIN"]  # not the service's drain any more
    assert world.slurm.node.reason == "bad DIMM"
    assert len(world.kube.ours()) == 1  # Slurm keeps it out: so does the taint


def test_a_failed_read_of_slurm_is_no_licence_to_drain(world: World) -> None:
    world.slurm.drain("bad DIMM")  # an administrator's, unseen: reads fail from now on
    world.slurm.reads_down = True
    world.cordon(True)
    assert world.settle(5)
    assert world.slurm.state_updates == []
    world.slurm.reads_down = False
    assert world.settle() == []
    assert world.slurm.state_updates == []  # drained already: left as it is
    assert world.slurm.node.reason == "bad DIMM"


def test_kubernetes_unreachable_drains_and_resumes_nothing_until_it_answers(
    world: World,
) -> None:
    drained_for_a_cordon(world)
    world.kube.down = True
    world.maintenance._resynced = None  # a resync is due: the list of Nodes fails
    world.cordon(False)  # the watch's last word before the outage
    errors = world.settle(5)
    assert errors
    assert all(isinstance(e, KubeError) for e in errors)
    assert world.slurm.state_updates == ["DRAIN"]

    world.kube.down = False
    assert world.settle() == []
    assert world.slurm.state_updates == ["DRAIN", "RESUME"]


def test_a_cordon_and_uncordon_during_an_outage_leave_slurm_as_it_was(world: World) -> None:
    world.slurm.down = True
    world.cordon(True)
    world.settle()
    world.cordon(False)
    world.settle()
    world.slurm.down = False
    assert world.settle() == []
    assert world.slurm.state_updates == []  # what is applied is the Node as it is now
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 0


# ---------------------------------------------------------------- disagreement


def test_a_drain_with_taints_off_disagrees_until_resumed(ledger: Ledger) -> None:
    world = make_world(ledger, slurm_taints=False)
    world.slurm.drain("hw check")
    world.settle(10)
    assert world.kube.ours() == []
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 1
    assert world.gauge("nodeledger_maintenance_oldest_disagreement_seconds") == 9
    world.cordon(True)  # the operator keeps Kubernetes off it too: the sides agree
    world.settle()
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 0
    world.slurm.resume()  # the administrator's drain ends: the cordon drains it again
    world.settle()
    assert world.slurm.state_updates == ["DRAIN"]
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 0
    world.cordon(False)
    world.settle()
    assert world.slurm.state_updates == ["DRAIN", "RESUME"]
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 0


def test_without_slurm_no_node_disagrees(ledger: Ledger) -> None:
    world = make_world(ledger, co_managed=False)
    world.cordon(True)
    world.settle()
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 0


def test_a_cordoned_node_slurm_does_not_list_is_no_drain_and_stalls_no_other(
    world: World,
) -> None:
    world.ledger.upsert_node("n2", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    world.cordoned["n2"] = True
    world.maintenance.mark(["n2"])
    assert world.settle() == []
    assert world.health() is None
    assert world.ledger.get_node("n2").health_reason == "Slurm has no node 'n2'"
    world.cordon(True)
    assert world.settle() == []
    assert world.slurm.state_updates == ["DRAIN"]  # n1's, not held up behind n2
    assert world.gauge("nodeledger_maintenance_disagreeing_nodes") == 0  # n2: one side only
