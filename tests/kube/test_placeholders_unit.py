"""Placeholder pods (issue 35), with fakes: their size is what the ledger keeps from pods
beyond the pods (so kube-scheduler's own filter never sees more room than the ledger), and
the controller creates, resizes and deletes them as the ledger changes. The real API
server and kube-scheduler: tests/kube/test_placeholders.py."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from app.core import placeholder
from app.core.caps import CPU_LABEL, KubeCaps
from app.core.decision import decide_admission
from app.core.pods import pod_info
from app.core.records import Holder, HolderKind, Holding, HoldingState, NodeSpec, NodeView
from app.core.resources import Resources
from app.kube.controllers.placeholders import Placeholder, Placeholders, remove_all
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from tests.support.placeholders import GIB, NODE, FakePods

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def node(
    *holdings: tuple[HolderKind, Resources],
    capacity: Resources = NODE,
    reserved: Resources = Resources.ZERO,
    labels: dict[str, str] | None = None,
) -> NodeView:
    held = tuple(
        Holding("a", Holder(kind, f"{kind.value}-{k}"), amount, HoldingState.HELD, T0, T0)
        for k, (kind, amount) in enumerate(holdings)
    )
    spec = NodeSpec(capacity=capacity, reserved=reserved, labels=labels or {})
    return NodeView("a", spec, None, None, held, T0, T0)


def test_the_size_is_what_slurm_and_manual_holdings_keep_from_pods() -> None:
    view = node(
        (HolderKind.SLURM_JOB, Resources(6000, 8 * GIB, 1)),
        (HolderKind.MANUAL, Resources(1000, GIB)),
        (HolderKind.POD, Resources(2000, 4 * GIB)),
    )
    # Pods count for the scheduler already; GPUs are never in a placeholder.
    assert placeholder.size(view, NODE, None) == Resources(7000, 9 * GIB, 0)
    assert placeholder.size(node((HolderKind.POD, Resources(16000, GIB))), NODE, None).is_zero()
    assert placeholder.size(node(), NODE, None).is_zero()


def test_a_node_that_admits_nothing_is_held_whole() -> None:
    """Drained, down or cordoned: the whole node less its pods, whether or not its taint
    has landed yet."""
    pods = (HolderKind.POD, Resources(2000, GIB))
    for cordon, health in (("kubectl cordon", None), (None, "Slurm node n1 is DOWN")):
        view = replace(node(pods), cordon_reason=cordon, health_reason=health)
        assert placeholder.size(view, NODE, None) == Resources(14000, 31 * GIB)


def test_the_size_covers_the_reservation_the_cap_and_a_larger_node_allocatable() -> None:
    reserved = node(reserved=Resources(2000, GIB))
    assert placeholder.size(reserved, NODE, None) == Resources(2000, GIB)
    # Slurm's size of the node (the ledger's capacity) smaller than the Node's allocatable.
    smaller = node(capacity=Resources(12000, 32 * GIB))
    assert placeholder.size(smaller, NODE, None) == Resources(4000, 0)
    capped = node((HolderKind.POD, Resources(4000, GIB)))
    assert placeholder.size(capped, NODE, KubeCaps(0.5, 1.0)) == Resources(8000, 0)
    labelled = node(labels={CPU_LABEL: "6"})
    assert placeholder.size(labelled, NODE, KubeCaps()) == Resources(10000, 0)
    invalid = node(labels={CPU_LABEL: "six"})  # refuses every pod: the whole node
    assert placeholder.size(invalid, NODE, KubeCaps()) == Resources(16000, 32 * GIB)
    overcommitted = node((HolderKind.SLURM_JOB, Resources(20000, 40 * GIB)))
    assert placeholder.size(overcommitted, NODE, None) == Resources(16000, 32 * GIB)


def test_on_a_node_pods_overcommit_it_never_falls_below_slurm_and_manual_holdings() -> None:
    """A 12-CPU job and a pod recorded at 8 CPUs as its kubelet runs it, on 16: the node
    admits nothing, and the placeholder still keeps the job's 12 CPUs (allocatable less
    the pods would be 8, which leaves a kubelet 4 to apply a deferred resize onto)."""
    job = (HolderKind.SLURM_JOB, Resources(12000, 4 * GIB))
    manual = (HolderKind.MANUAL, Resources(1000, GIB))
    grown = node(job, manual, (HolderKind.POD, Resources(8000, 2 * GIB)))
    assert grown.not_admissible_reason is not None
    assert placeholder.size(grown, NODE, None) == Resources(13000, 30 * GIB)
    drained = replace(grown, cordon_reason="kubectl cordon")
    assert placeholder.size(drained, NODE, None) == Resources(13000, 30 * GIB)
    # Where it admits, the kubelet's room is the ledger's free room: the job's CPUs stay.
    fits = node(job, (HolderKind.POD, Resources(4000, GIB)))
    assert placeholder.size(fits, NODE, None) == Resources(12000, 4 * GIB)


amounts = st.builds(Resources, st.integers(0, 20000), st.integers(0, 40 * GIB), st.integers(0, 0))
kinds = st.sampled_from([HolderKind.POD, HolderKind.SLURM_JOB, HolderKind.MANUAL])


@given(
    holdings=st.lists(st.tuples(kinds, amounts), max_size=5),
    capacity=amounts,
    reserved=amounts,
    allocatable=amounts,
    fraction=st.sampled_from([None, 0.25, 0.5, 1.0]),
    pod=amounts,
)
def test_what_kube_scheduler_lets_fit_the_ledger_admits(
    holdings: list[tuple[HolderKind, Resources]],
    capacity: Resources,
    reserved: Resources,
    allocatable: Resources,
    fraction: float | None,
    pod: Resources,
) -> None:
    """kube-scheduler's NodeResourcesFit: a pod fits when it is within the Node's
    allocatable less every pod on it, the placeholder included. Whenever it does, the
    ledger's decision holds it (on the same figures: a bind then admits)."""
    view = node(*holdings, capacity=capacity, reserved=reserved)
    caps = None if fraction is None else KubeCaps(fraction, fraction)
    size = placeholder.size(view, allocatable, caps)
    assert size.is_nonnegative()
    assert size.gpus == 0
    scheduler_room = allocatable - view.held_by_kubernetes - size
    # A pod that requests nothing fits any node for the scheduler: a node that admits
    # nothing keeps it off by its taint (or cordon), not by its placeholder.
    if pod.fits_within(scheduler_room) and not pod.is_zero():
        assert not decide_admission(view, pod, caps=caps).refused
    # Never more withheld than needed: the scheduler's room is the ledger's, up to what
    # the Node itself has left (no room is no room, however far below zero).
    room = (allocatable - view.held_by_kubernetes).at_most(placeholder.room(view, caps))
    assert (max(scheduler_room.cpu_millis, 0), max(scheduler_room.memory_bytes, 0)) == (
        max(room.cpu_millis, 0),
        max(room.memory_bytes, 0),
    )
    # On a node that admits nothing, never below what others than pods hold there.
    if view.not_admissible_reason is not None:
        others = (view.held - view.held_by_kubernetes).at_most(allocatable)
        assert replace(others, gpus=0).fits_within(size)


def test_names_fit_a_pod_name_and_stay_apart() -> None:
    assert placeholder.pod_name("kn1") == "nodeledger-held-kn1"
    long_a, long_b = "a" * 250 + ".x", "a" * 250 + ".y"
    names = {placeholder.pod_name(long_a), placeholder.pod_name(long_b)}
    assert len(names) == 2
    assert all(len(n) <= 253 for n in names)
    assert placeholder.is_placeholder("nl", "nodeledger-held-kn1", "kn1", "nl")
    # The name of another node's placeholder, another namespace, or unbound: a holder.
    assert not placeholder.is_placeholder("nl", "nodeledger-held-kn1", "kn2", "nl")
    assert not placeholder.is_placeholder("default", "nodeledger-held-kn1", "kn1", "nl")
    assert not placeholder.is_placeholder("nl", "nodeledger-held-kn1", None, "nl")


def test_the_pod_is_bound_owned_by_its_node_tolerant_and_resizable() -> None:
    pod = placeholder.pod(
        "kn1", "uid-1", Resources(1500, GIB), namespace="nl", image="pause", priority_class="pc"
    )
    spec = pod["spec"]
    assert spec["nodeName"] == "kn1"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "pc"
    container = spec["containers"][0]
    quantities = {"cpu": "1500m", "memory": str(GIB)}
    assert container["resources"] == {"requests": quantities, "limits": quantities}
    assert {p["restartPolicy"] for p in container["resizePolicy"]} == {"NotRequired"}
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Node", "uid-1", True)
    assert pod_info(pod).requests == Resources(1500, GIB)  # read back as the watch reads it
    patch = placeholder.resize(Resources(500, 2 * GIB))["spec"]["containers"][0]
    quantities = {"cpu": "500m", "memory": str(2 * GIB)}
    assert patch["resources"] == {"requests": quantities, "limits": quantities}


def controller(ledger: Ledger, pods: FakePods, nodes: dict[str, Resources]) -> Placeholders:
    return Placeholders(
        NodeSnapshot(ledger), pods, lambda n: (nodes[n], f"uid-{n}") if n in nodes else None,  # type: ignore[arg-type]
        None, namespace="nl", image="pause", qps=1000, burst=1000,
    )  # fmt: skip


def flush(placeholders: Placeholders) -> list[tuple[str, str]]:
    """The API calls of one pass, after the snapshot told of the changes."""
    before = len(placeholders.client.calls)  # type: ignore[attr-defined]
    placeholders.snapshot.views(max_age=0)
    placeholders.flush(threading.Event())
    return placeholders.client.calls[before:]  # type: ignore[attr-defined,no-any-return]


def test_placeholders_follow_the_ledger_one_call_per_change(ledger: Ledger) -> None:
    for name in ("a", "b"):
        ledger.upsert_node(name, NodeSpec(capacity=NODE))
    pods = FakePods()
    placeholders = controller(ledger, pods, {"a": NODE, "b": NODE})
    placeholders.snapshot.subscribe(placeholders.mark)
    placeholders.resync([])
    assert flush(placeholders) == []  # idle nodes need none
    ledger.admit("a", Holder(HolderKind.MANUAL, "m1"), Resources(4000, 2 * GIB))
    assert flush(placeholders) == [("POST", "nodeledger-held-a")]
    assert pods.requests("a") == {"cpu": "4000m", "memory": str(2 * GIB)}
    ledger.admit("a", Holder(HolderKind.POD, "p1"), Resources(2000, GIB))
    assert flush(placeholders) == []  # a pod is the scheduler's to count
    ledger.admit("a", Holder(HolderKind.MANUAL, "m2"), Resources(1000, 0))
    assert flush(placeholders) == [("PATCH", "nodeledger-held-a")]
    assert pods.requests("a") == {"cpu": "5000m", "memory": str(2 * GIB)}
    ledger.release("m1", HolderKind.MANUAL)
    ledger.release("m2", HolderKind.MANUAL)
    assert flush(placeholders) == [("DELETE", "nodeledger-held-a")]
    assert pods.requests("a") is None
    assert flush(placeholders) == []


def test_a_placeholder_deleted_or_failed_behind_its_back_is_made_again(ledger: Ledger) -> None:
    ledger.upsert_node("a", NodeSpec(capacity=NODE))
    ledger.admit("a", Holder(HolderKind.MANUAL, "m1"), Resources(4000, GIB))
    pods = FakePods()
    placeholders = controller(ledger, pods, {"a": NODE})
    placeholders.resync([])
    assert flush(placeholders) == [("POST", "nodeledger-held-a")]
    # `kubectl drain` evicted it: the watch's DELETED event.
    body = pods.pods.pop("nodeledger-held-a")
    placeholders.on_event("DELETED", placeholders.decode(body))
    assert flush(placeholders) == [("POST", "nodeledger-held-a")]
    # Its kubelet refused it (a Failed pod no longer counts for the scheduler): deleted,
    # and made again once RETRY_FAILED has passed, not at once.
    failed = {**pods.pods["nodeledger-held-a"], "status": {"phase": "Failed"}}
    placeholders.on_event("MODIFIED", placeholders.decode(failed))
    assert flush(placeholders) == [("DELETE", "nodeledger-held-a")]
    placeholders.on_event("DELETED", placeholders.decode(failed))
    assert flush(placeholders) == []
    placeholders._failed["a"] = 0.0  # the wait is over
    placeholders._retry_failed()
    assert flush(placeholders) == [("POST", "nodeledger-held-a")]
    # The watch restarts on a list that has it: nothing to do.
    listed = [placeholders.decode(p) for p in pods.pods.values()]
    placeholders.resync(listed)
    assert flush(placeholders) == []


def test_a_create_that_conflicts_waits_for_the_old_one_to_go(ledger: Ledger) -> None:
    ledger.upsert_node("a", NodeSpec(capacity=NODE))
    ledger.admit("a", Holder(HolderKind.MANUAL, "m1"), Resources(4000, GIB))
    pods = FakePods()
    pods.conflict = True  # the last one is still terminating
    placeholders = controller(ledger, pods, {"a": NODE})
    placeholders.resync([])
    assert flush(placeholders) == [("POST", "nodeledger-held-a")]
    assert flush(placeholders) == []  # no loop of creates: its DELETED event brings it back
    pods.conflict = False
    placeholders.on_event("DELETED", placeholder_of("a", Resources(1, 1)))
    assert flush(placeholders) == [("POST", "nodeledger-held-a")]


def test_a_node_that_goes_loses_its_placeholder(ledger: Ledger) -> None:
    ledger.upsert_node("a", NodeSpec(capacity=NODE))
    ledger.admit("a", Holder(HolderKind.MANUAL, "m1"), Resources(4000, GIB))
    pods, nodes = FakePods(), {"a": NODE}
    placeholders = controller(ledger, pods, nodes)
    placeholders.resync([])
    flush(placeholders)
    del nodes["a"]  # the Node was deleted (its owner reference also lets Kubernetes do it)
    placeholders.mark(["a"])
    assert flush(placeholders) == [("DELETE", "nodeledger-held-a")]


def placeholder_of(node: str, amount: Resources) -> Placeholder:
    info = pod_info(placeholder.pod(node, "", amount, namespace="nl", image="pause"))
    return Placeholder(info.name, info.node or "", info.requests)


def test_with_placeholders_off_those_left_are_deleted(ledger: Ledger) -> None:
    pods = FakePods()
    for node in ("a", "b"):
        body = placeholder.pod(node, "", Resources(1000, GIB), namespace="nl", image="pause")
        pods.pods[body["metadata"]["name"]] = body
    assert remove_all(pods, "nl") == 2  # type: ignore[arg-type]
    assert pods.pods == {}
    assert remove_all(pods, "nl") == 0  # type: ignore[arg-type]
