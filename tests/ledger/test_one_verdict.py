"""The ledger, the scheduler extender and the Slurm gate never disagree on a node, because
they all read the one admission decision (app.core.decision): a pod the extender's filter
lets through is one the ledger holds and the gate's cap check then confirms, a pod it
filters out is one that either refuses, and a pod the ledger holds at once inside the
node's headroom is one the gate would have confirmed. The decision is the same on either
view of the node (NodeView, NodeTotals), and the ledger does what it says. Random nodes
(capacity, reserved, holdings of every kind with or without GPU devices, overcommitted,
cordoned, unhealthy, label caps, a headroom target and grant) and requests (named devices
or not, the headroom's path open or not) on a real ledger."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from app.core.caps import CPU_LABEL, KubeCaps
from app.core.decision import AdmissionDecision, Outcome, decide_admission, decide_each
from app.core.headroom import HeadroomPolicy
from app.core.ledger_errors import AdmissionRejected, DeviceTaken, LedgerError
from app.core.placement import filter_nodes
from app.core.records import (
    HeldDevice,
    Holder,
    HolderKind,
    HoldingState,
    NodeHeadroom,
    NodeSpec,
    NodeTotals,
    NodeView,
    Recording,
)
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger
from app.ledger.tables import HoldingRow, device_objects

GIB = 2**30
NAMES = itertools.count()


def amounts(cpus: int, gib: int, gpus: int) -> st.SearchStrategy[Resources]:
    """Up to ``cpus`` CPUs in half-CPU steps, ``gib`` GiB, ``gpus`` GPUs."""
    return st.builds(
        Resources,
        st.integers(0, 2 * cpus).map(lambda c: c * 500),
        st.integers(0, gib).map(lambda m: m * GIB),
        st.integers(0, gpus),
    )


DEVICES = st.lists(st.integers(0, 4), max_size=2).map(tuple)


@dataclass(frozen=True)
class Case:
    capacity: Resources
    reserved: Resources
    holdings: tuple[tuple[HolderKind, Resources, tuple[int, ...]], ...]
    cordon: str | None
    health: str | None
    cpu_label: str | None
    caps: KubeCaps | None
    request: Resources
    named: tuple[int, ...]  # the request's GPU devices (often not valid for it)
    amount: Resources  # the headroom policy's
    headroom: NodeHeadroom
    open: bool  # the gate lets the admission use the headroom


def disjoint_devices(
    held: list[tuple[HolderKind, Resources, list[int]]],
) -> tuple[tuple[HolderKind, Resources, tuple[int, ...]], ...]:
    """The holdings, each device with one holder at most: the ledger never gives a device
    to two holdings, and which of two it names in a refusal would be the database's order."""
    taken: set[int] = set()
    out = []
    for kind, amount, devices in held:
        mine = tuple(d for d in devices if d not in taken)
        taken.update(mine)
        out.append((kind, amount, mine))
    return tuple(out)


cases = st.builds(
    Case,
    # Mostly room for the request: the interesting cases are about caps and the headroom.
    capacity=amounts(16, 64, 4).map(lambda amount: amount + Resources(4000, 16 * GIB, 2)),
    reserved=st.one_of(st.just(Resources.ZERO), amounts(2, 4, 1)),
    holdings=st.lists(
        st.tuples(
            st.sampled_from(list(HolderKind)),
            amounts(2, 8, 1),
            st.one_of(st.just(()), st.lists(st.integers(0, 3), max_size=2, unique=True)),
        ),
        max_size=3,
    ).map(disjoint_devices),
    # Mostly admissible.
    cordon=st.sampled_from([*[None] * 7, "maintenance"]),
    health=st.sampled_from([*[None] * 7, "Slurm node n is DOWN"]),
    cpu_label=st.sampled_from([None, "1", "2500m", "not-a-quantity"]),
    caps=st.sampled_from([None, KubeCaps(), KubeCaps(0.5, 0.75)]),
    request=amounts(4, 16, 1),
    named=st.one_of(st.just(()), st.just(()), st.just(()), DEVICES),
    amount=st.sampled_from([Resources.ZERO, Resources(2000, 4 * GIB), Resources(1000, GIB, 1)]),
    headroom=st.builds(
        NodeHeadroom,
        st.one_of(st.just(Resources.ZERO), amounts(4, 8, 1)),
        amounts(16, 64, 4).map(lambda amount: amount + Resources(4000, 16 * GIB, 2)),
        st.just(datetime(2026, 11, 27, tzinfo=UTC)),
    ),
    open=st.booleans(),
)


@given(case=cases)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_ledger_the_extender_and_the_gate_decide_alike(database: Database, case: Case) -> None:
    ledger = Ledger(database, headroom=HeadroomPolicy(amount=case.amount, caps=case.caps))
    name = node(ledger, case)
    before = ledger.get_node(name)
    holder = Holder(HolderKind.POD, f"{name}-new")
    # Named once each: a device named twice is a malformed request (app.core.devices
    # .held_devices refuses it before any node is read), not the node's decision.
    named = tuple(sorted(set(case.named)))
    # The devices other holdings have, as the ledger reads them when devices are named.
    held_devices = [(h.holder, h.device_indices) for h in before.holdings if h.devices]
    decided = decide(before, case, holder, named, held_devices)
    # The decision never cares which view of the node it got.
    assert summary(decide(totals(before), case, holder, named, held_devices)) == summary(decided)

    fits, failed = filter_nodes(case.request, [name], {name: before}, case.caps)
    # The filter's loop over many nodes decides as the decision does, node by node.
    ungated = decide_admission(before, case.request, caps=case.caps)
    assert [summary(d) for d in decide_each([before], case.request, case.caps)] == [
        summary(ungated)
    ]

    # The ledger holds (PENDING, as with the gate on) what the decision says, as it says.
    refused: LedgerError | None = None
    try:
        admission = ledger.admit(
            name,
            holder,
            case.request,
            state=HoldingState.PENDING,
            headroom=case.open,
            devices=tuple(HeldDevice(d) for d in named),
        )
    except LedgerError as exc:
        refused = exc
    if refused is not None:
        assert decided.refused, f"the ledger refused what the decision holds: {refused}"
        assert (type(refused), str(refused)) == (type(decided.error), str(decided.error))
        if isinstance(refused, DeviceTaken) or not isinstance(refused, AdmissionRejected):
            # The extender does not see devices: DRA's allocator names them.
            event("refused for its devices")
            return
        event("refused by the ledger")
        assert fits == [], f"the extender let through what the ledger refused: {refused}"
        assert failed[name] in str(refused)
        return
    assert not decided.refused, decided.verdict.reason
    held = HoldingState.HELD if decided.outcome is Outcome.HELD_NOW else HoldingState.PENDING
    assert admission.holding.state is held
    after = ledger.get_node(name)
    if decided.target is not None:
        assert after.headroom.target == decided.target
    # The gate's cap check, on the node as its push reads it (the hold included).
    confirmed = not decide_admission(after, Resources.ZERO, caps=case.caps, held=True).refused
    if decided.within_headroom:
        event("held at once inside the headroom")
        assert confirmed, "the headroom held at once what the gate would refuse"
    else:
        event("confirmed by the gate" if confirmed else "refused by the gate's cap")
    assert confirmed == (fits == [name]), failed
    if not confirmed:
        gate = decide_admission(after, Resources.ZERO, caps=case.caps, held=True)
        assert failed[name] == gate.verdict.reason


def node(ledger: Ledger, case: Case) -> str:
    """The case's node on the ledger: its holdings (their devices as a device holding
    has them), health and headroom."""
    name = f"n{next(NAMES)}"
    labels = {CPU_LABEL: case.cpu_label} if case.cpu_label else {}
    ledger.upsert_node(
        name,
        NodeSpec(case.capacity, case.reserved, labels=labels),
        cordon_reason=case.cordon,
        force=True,
    )
    ledger.record_many(
        [
            Recording(name, Holder(kind, f"{name}-{i}"), amount)
            for i, (kind, amount, _) in enumerate(case.holdings)
        ],
        reason="the case's holdings",
    )
    with ledger.store.write() as repo:
        row = repo.lock_node(name)
        for i, (_, _, devices) in enumerate(case.holdings):
            if devices:
                holder_id = f"{name}-{i}"
                repo.session.execute(
                    update(HoldingRow)
                    .where(HoldingRow.holder_id == holder_id)
                    .values(devices=device_objects(HeldDevice(d) for d in devices))
                )
        repo.set_headroom(row.id, case.headroom)
    if case.health:
        ledger.set_health(name, case.health)
    return name


def decide(
    view: NodeView | NodeTotals,
    case: Case,
    holder: Holder,
    named: tuple[int, ...],
    held_devices: list[tuple[Holder, tuple[int, ...]]],
) -> AdmissionDecision:
    """The decision as the ledger makes it (gated: PENDING), on ``view``."""
    return decide_admission(
        view,
        case.request,
        caps=case.caps,
        gated=True,
        headroom=HeadroomPolicy(amount=case.amount, caps=case.caps) if case.open else None,
        holder=holder,
        devices=named,
        held_devices=held_devices,
    )


def totals(view: NodeView) -> NodeTotals:
    by_kind = {kind: view.held_by(kind) for kind in HolderKind if not view.held_by(kind).is_zero()}
    return NodeTotals(
        view.name, view.spec, view.cordon_reason, view.health_reason, by_kind, view.headroom
    )


def summary(decision: AdmissionDecision) -> tuple[object, ...]:
    """What a decision says (its errors compared by type and text, not identity)."""
    error = (type(decision.error), str(decision.error)) if decision.refused else None
    return (decision.outcome, decision.verdict, error, decision.target, decision.refill)
