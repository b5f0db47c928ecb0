"""The ledger, the scheduler extender and the Slurm gate never disagree on a node: a pod
the extender's filter lets through is one the ledger holds and the gate's cap check then
confirms, and a pod it filters out is one that either refuses (app.core.verdict). Random
nodes (capacity, reserved, holdings of every kind, overcommitted, cordoned, unhealthy,
label caps) on a real ledger."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.core.caps import CPU_LABEL, KubeCaps
from app.core.ledger_errors import AdmissionRejected
from app.core.placement import filter_nodes
from app.core.records import Holder, HolderKind, HoldingState, NodeSpec, Recording
from app.core.resources import Resources
from app.core.verdict import verdict
from app.ledger.service import Ledger

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


@dataclass(frozen=True)
class Case:
    capacity: Resources
    reserved: Resources
    holdings: tuple[tuple[HolderKind, Resources], ...]
    cordon: str | None
    health: str | None
    cpu_label: str | None
    caps: KubeCaps | None
    request: Resources


cases = st.builds(
    Case,
    capacity=amounts(16, 64, 4),
    reserved=st.one_of(st.just(Resources.ZERO), amounts(2, 4, 1)),
    holdings=st.lists(
        st.tuples(st.sampled_from(list(HolderKind)), amounts(2, 8, 1)), max_size=3
    ).map(tuple),
    # Mostly admissible: the interesting cases are about fit and caps.
    cordon=st.sampled_from([None, None, None, "maintenance"]),
    health=st.sampled_from([None, None, None, "Slurm node n is DOWN"]),
    cpu_label=st.sampled_from([None, "1", "2500m", "not-a-quantity"]),
    caps=st.sampled_from([None, KubeCaps(), KubeCaps(0.5, 0.75)]),
    request=amounts(4, 16, 1),
)


@given(case=cases)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_ledger_the_extender_and_the_gate_decide_alike(ledger: Ledger, case: Case) -> None:
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
            for i, (kind, amount) in enumerate(case.holdings)
        ],
        reason="the case's holdings",
    )
    if case.health:
        ledger.set_health(name, case.health)

    fits, failed = filter_nodes(case.request, [name], {name: ledger.get_node(name)}, case.caps)

    # The ledger holds (PENDING, as with the gate on); the gate checks the cap on the node
    # as its push reads it, the hold included.
    holder = Holder(HolderKind.POD, f"{name}-new")
    refused: str | None = None
    try:
        ledger.admit(name, holder, case.request, state=HoldingState.PENDING)
    except AdmissionRejected as exc:
        refused = str(exc)
    if refused is not None:
        event("refused by the ledger")
        assert fits == [], f"the extender let through what the ledger refused: {refused}"
        assert failed[name] in refused
        return
    confirmed = verdict(ledger.get_node(name), case.request, case.caps, held=True)
    event("confirmed" if confirmed.admitted else "refused by the gate's cap")
    assert confirmed.admitted == (fits == [name]), (confirmed.reason, failed)
    if not confirmed.admitted:
        assert failed[name] == confirmed.reason
