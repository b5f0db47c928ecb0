"""Node discovery when a Kubernetes Node is deleted: the ledger lets the node go, cordons
it while something holds on it, or refuses, which is logged and stops nothing else; and a
Node's health (Ready, out-of-service taint), whose changes pod accounting is told first."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest

from app.core.ledger_errors import LedgerError
from app.core.pod_release import OUT_OF_SERVICE_TAINT as OUT_OF_SERVICE
from app.core.pod_release import NodeHealth
from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.kube.client import GENERICNODES
from app.kube.controllers.discovery import NodeDiscovery, NodeInfo, NodeShape
from app.ledger.service import Ledger

GIB = 2**30


class RecordingClient:
    """KubeClient.request, recording the calls; every call succeeds."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        return {}


class RefusingLedger(Ledger):
    """A ledger whose delete fails in a way discovery does not handle."""

    def delete_node(self, name: str) -> None:
        raise LedgerError(f"cannot delete {name}: the ledger says no")


def discovery(ledger: Ledger, client: RecordingClient) -> NodeDiscovery:
    return NodeDiscovery(
        ledger,
        client,  # type: ignore[arg-type]
        lambda _name: None,
        slurm_node_label="slurm-node",
        cluster_name="test",
        gpu_resource="nvidia.com/gpu",
    )


def test_a_deleted_node_leaves_the_ledger_and_its_genericnode_goes(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    client = RecordingClient()
    discovery(ledger, client)._remove("n1")
    assert "n1" not in ledger.node_specs()
    assert client.calls == [("DELETE", f"{GENERICNODES}/n1")]


def test_a_deleted_node_with_holdings_is_cordoned(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    ledger.admit("n1", Holder(HolderKind.POD, "p1"), Resources(1000, GIB))
    discovery(ledger, RecordingClient())._remove("n1")
    assert ledger.get_node("n1").cordon_reason == "the Kubernetes Node was deleted"


def test_a_node_the_ledger_never_had_is_forgotten_quietly(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    client = RecordingClient()
    with caplog.at_level(logging.DEBUG, logger="app.kube.controllers.discovery"):
        discovery(ledger, client)._remove("ghost")
    assert not caplog.records
    assert client.calls == [("DELETE", f"{GENERICNODES}/ghost")]


def test_a_ledger_refusal_is_logged_and_the_genericnode_still_goes(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = RefusingLedger(ledger.db)
    refusing.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32 * GIB)))
    client = RecordingClient()
    with caplog.at_level(logging.WARNING, logger="app.kube.controllers.discovery"):
        discovery(refusing, client)._remove("n1")
    assert [r.getMessage() for r in caplog.records] == [
        "the Kubernetes Node n1 is gone, but the ledger keeps it: "
        "cannot delete n1: the ledger says no"
    ]
    assert client.calls == [("DELETE", f"{GENERICNODES}/n1")]


@pytest.mark.parametrize(
    ("gpus_from_slurm", "allocatable_gpus", "slurm", "expected"),
    [
        pytest.param(False, 0, Resources(8000, GIB, 4), 0, id="counted-none-advertised"),
        pytest.param(False, 2, Resources(8000, GIB, 4), 2, id="counted-smaller"),
        pytest.param(True, 0, Resources(8000, GIB, 4), 4, id="dra-gpus-are-slurms"),
        pytest.param(True, 8, Resources(8000, GIB, 4), 4, id="dra-slurm-not-more"),
        pytest.param(True, 2, None, 2, id="dra-slurm-unknown"),
    ],
)
def test_with_dra_drivers_a_nodes_gpus_are_slurms(
    ledger: Ledger,
    gpus_from_slurm: bool,
    allocatable_gpus: int,
    slurm: Resources | None,
    expected: int,
) -> None:
    """Co-managed GPUs are in ResourceSlices, not the Node's allocatable (issue 23)."""
    found = NodeDiscovery(
        ledger, RecordingClient(), lambda _name: slurm,  # type: ignore[arg-type]
        slurm_node_label="slurm-node", cluster_name="test", gpu_resource="nvidia.com/gpu",
        gpus_from_slurm=gpus_from_slurm,
    )  # fmt: skip
    node = NodeInfo("kn3", "n3", Resources(16000, 32 * GIB, allocatable_gpus))
    capacity = found._spec(node).capacity
    assert capacity.gpus == expected
    assert capacity.cpu_millis == (8000 if slurm else 16000)


def node_object(
    name: str, ready: str | None = "True", taints: list[str] | None = None
) -> dict[str, Any]:
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    return {
        "metadata": {"name": name},
        "spec": {"taints": [{"key": k, "effect": "NoExecute"} for k in taints or []]},
        "status": {"allocatable": {"cpu": "16", "memory": "32Gi"}, "conditions": conditions},
    }


@pytest.mark.parametrize(
    ("ready", "taints", "expected"),
    [
        pytest.param("True", [], NodeHealth(True), id="ready"),
        pytest.param("False", [], NodeHealth(False), id="not-ready"),
        pytest.param("Unknown", [], NodeHealth(False), id="unknown"),
        pytest.param(None, [], NodeHealth(True), id="no-kubelet-report-yet"),
        pytest.param("Unknown", [OUT_OF_SERVICE], NodeHealth(False, True), id="out-of-service"),
        pytest.param(
            "True", ["node.kubernetes.io/unreachable"], NodeHealth(True), id="other-taint"
        ),
    ],
)
def test_a_nodes_health_is_its_ready_condition_and_out_of_service_taint(
    ledger: Ledger, ready: str | None, taints: list[str], expected: NodeHealth
) -> None:
    found = discovery(ledger, RecordingClient())
    obj = node_object("kn1", ready, taints)
    assert found.decode(obj).health == expected
    # The shape the node watch parses pages into keeps what this reads.
    shaped = msgspec.json.decode(msgspec.json.encode(obj), type=NodeShape)
    assert found.decode(shaped).health == expected  # type: ignore[arg-type]


def test_pod_accounting_is_told_of_health_changes_before_the_ledger_lets_a_node_go(
    ledger: Ledger,
) -> None:
    found = discovery(ledger, RecordingClient())
    told: list[tuple[list[str], bool]] = []  # names, and whether the ledger still had kn1
    found.health_changed = lambda names: told.append((names, "kn1" in ledger.node_specs()))
    found.on_event("ADDED", found.decode(node_object("kn1")))
    found.on_event("MODIFIED", found.decode(node_object("kn1")))  # nothing changed
    assert told == []
    found.on_event("MODIFIED", found.decode(node_object("kn1", "Unknown")))
    assert found.health("kn1") == NodeHealth(False)
    found.on_event("MODIFIED", found.decode(node_object("kn1", "Unknown", [OUT_OF_SERVICE])))
    found.on_event("DELETED", found.decode(node_object("kn1", "Unknown", [OUT_OF_SERVICE])))
    assert told == [(["kn1"], True)] * 3
    assert found.health("kn1") is None
    assert "kn1" not in ledger.node_specs()


def test_a_resync_tells_pod_accounting_of_every_node_and_those_gone(ledger: Ledger) -> None:
    found = discovery(ledger, RecordingClient())
    found.on_event("ADDED", found.decode(node_object("kn1")))
    found.on_event("ADDED", found.decode(node_object("kn2")))
    told: list[list[str]] = []
    found.health_changed = told.append
    found.client.list = lambda *args, **kwargs: ([], "1")  # type: ignore[attr-defined]
    found.resync([found.decode(node_object("kn1"))])
    assert told == [["kn1", "kn2"]]


def test_the_placeholders_are_told_of_nodes_that_come_go_or_change_size(ledger: Ledger) -> None:
    found = discovery(ledger, RecordingClient())
    told: list[list[str]] = []
    found.sizes_changed = told.append
    added = node_object("kn1")
    added["metadata"]["uid"] = "uid-1"
    found.on_event("ADDED", found.decode(added))
    assert found.node_ref("kn1") == (Resources(16000, 32 * GIB), "uid-1")
    found.on_event("MODIFIED", found.decode(added))  # nothing changed: not told
    bigger = {**added, "status": {"allocatable": {"cpu": "32", "memory": "32Gi"}}}
    found.on_event("MODIFIED", found.decode(bigger))
    found.on_event("DELETED", found.decode(bigger))
    assert told == [["kn1"]] * 3
    assert found.node_ref("kn1") is None
