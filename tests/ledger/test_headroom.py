"""The headroom's decisions (app.core.headroom), pure, and as the ledger applies them on a
real database: which admissions skip the gate, how the target grows and is given back, and
how a push's exclusive hold lowers and raises the grant."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from app.core.caps import CPU_LABEL as CAP_LABEL
from app.core.caps import KubeCaps
from app.core.decision import Outcome, decide_admission
from app.core.headroom import (
    CPU_LABEL,
    GPU_LABEL,
    MEMORY_LABEL,
    HeadroomPolicy,
    admit_step,
    free,
    released_target,
    settled_target,
)
from app.core.records import (
    EventKind,
    Holder,
    HolderKind,
    HoldingState,
    NodeHeadroom,
    NodeSpec,
    NodeTotals,
)
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger

GIB = 2**30
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
AMOUNT = Resources(2000, 4 * GIB)
POLICY = HeadroomPolicy(amount=AMOUNT, low_water=0.5, grow_step=1.0, max_factor=3.0)


def node(
    pods: Resources = Resources.ZERO,
    target: Resources = Resources.ZERO,
    granted: Resources = Resources.ZERO,
    labels: dict[str, str] | None = None,
) -> NodeTotals:
    spec = NodeSpec(Resources(16000, 64 * GIB, 4), labels=labels or {})
    held = {HolderKind.POD: pods} if not pods.is_zero() else {}
    return NodeTotals("n1", spec, None, None, held, NodeHeadroom(target, granted, T0))


# ---------------------------------------------------------------- the policy, pure


def test_labels_override_the_amount_per_resource_and_a_bad_one_gives_none() -> None:
    labels = {CPU_LABEL: "500m", GPU_LABEL: "1"}
    assert POLICY.amount_for(labels) == Resources(500, 4 * GIB, 1)
    assert POLICY.amount_for({MEMORY_LABEL: "lots"}) == Resources(2000, 0, 0)
    assert POLICY.amount_for({CPU_LABEL: "-1"}).cpu_millis == 0
    assert POLICY.amount_for({GPU_LABEL: "two"}).gpus == 0


def test_no_headroom_on_the_node_leaves_every_admission_to_the_gate() -> None:
    assert HeadroomPolicy().amount_for({}) == Resources.ZERO
    assert admit_step(node(), Resources(500, GIB), HeadroomPolicy()) is None
    zero = {CPU_LABEL: "0", MEMORY_LABEL: "0"}
    assert admit_step(node(labels=zero), Resources(500, GIB), POLICY) is None


def test_the_first_admission_after_idle_takes_the_gate_and_sets_the_target() -> None:
    step = admit_step(node(), Resources(500, GIB), POLICY)
    assert step is not None
    assert (step.fast, step.target) == (False, AMOUNT)


def test_inside_the_grant_is_fast_and_low_water_asks_for_a_refill() -> None:
    granted = Resources(3000, 5 * GIB)  # 1 CPU of pods + the 2 CPU target, read back
    busy = node(pods=Resources(1000, GIB), target=AMOUNT, granted=granted)
    step = admit_step(busy, Resources(500, GIB), POLICY)
    assert step is not None
    assert (step.fast, step.target, step.refill) == (True, AMOUNT, False)  # 1.5 CPUs left
    step = admit_step(busy, Resources(1500, GIB), POLICY)
    assert step is not None
    assert (step.fast, step.refill) == (True, True)  # 0.5 CPU left, below half of 2
    assert free(busy) == Resources(2000, 4 * GIB)


def test_beyond_the_grant_takes_the_gate_and_grows_the_target_up_to_its_maximum() -> None:
    busy = node(pods=Resources(1000, GIB), target=AMOUNT, granted=Resources(3000, 5 * GIB))
    step = admit_step(busy, Resources(2500, GIB), POLICY)
    assert step is not None
    assert (step.fast, step.target) == (False, Resources(4000, 8 * GIB))
    large = Resources(5000, 11 * GIB)
    grown = replace(busy, headroom=NodeHeadroom(large, Resources(6000, 12 * GIB)))
    step = admit_step(grown, Resources(5500, GIB), POLICY)
    assert step is not None
    assert step.target == Resources(6000, 12 * GIB)  # 3 x the amount at most


def test_a_burst_grows_the_target_once_per_push() -> None:
    """Slurm does not withhold the grown target yet (its push is under way): the next
    admission that does not fit waits for it rather than growing it again."""
    pushing = node(
        pods=Resources(1000, GIB), target=Resources(4000, 8 * GIB), granted=Resources(3000, 5 * GIB)
    )
    step = admit_step(pushing, Resources(2500, GIB), POLICY)
    assert step is not None
    assert (step.fast, step.target) == (False, Resources(4000, 8 * GIB))


def test_the_kubernetes_cap_holds_inside_the_headroom_too() -> None:
    capped = HeadroomPolicy(amount=AMOUNT, caps=KubeCaps())
    busy = node(
        pods=Resources(1000, GIB),
        target=AMOUNT,
        granted=Resources(3000, 5 * GIB),
        labels={CAP_LABEL: "2"},
    )
    # 2.5 CPUs > the 2 CPU cap: the decision's cap check is verdict's own.
    decision = decide_admission(
        busy, Resources(1500, GIB), caps=capped.caps, gated=True, headroom=capped
    )
    assert decision.outcome is Outcome.NEEDS_GATE  # the gate refuses it, with the cap's reason
    assert decision.target == Resources(4000, 8 * GIB)  # grown: Slurm withheld the target
    inside = decide_admission(
        busy, Resources(500, GIB), caps=capped.caps, gated=True, headroom=capped
    )
    assert inside.within_headroom


def test_idle_gives_the_headroom_back_and_a_lowered_label_lowers_it() -> None:
    headroom = NodeHeadroom(Resources(4000, 8 * GIB), Resources(5000, 9 * GIB), T0)
    policy = replace(POLICY, idle_seconds=60)
    assert settled_target({}, headroom, policy, T0 + timedelta(seconds=59)) == headroom.target
    assert settled_target({}, headroom, policy, T0 + timedelta(seconds=60)) == Resources.ZERO
    lowered = settled_target({CPU_LABEL: "1"}, headroom, policy, T0)
    assert lowered == Resources(3000, 8 * GIB)  # 3 x 1 CPU; memory's maximum is 12 GiB
    assert settled_target({}, NodeHeadroom(), policy, T0) == Resources.ZERO


def test_slurm_jobs_waiting_for_resources_take_the_headroom_back_at_once() -> None:
    headroom = NodeHeadroom(Resources(4000, 8 * GIB), Resources(5000, 9 * GIB), T0)
    assert settled_target({}, headroom, POLICY, T0, contended=True) == Resources.ZERO
    assert settled_target({}, headroom, POLICY, T0, contended=False) == headroom.target


def test_a_release_adds_to_the_target_up_to_its_maximum_and_an_idle_node_gives_back() -> None:
    headroom = NodeHeadroom(AMOUNT, AMOUNT, T0)
    freed = Resources(1500, GIB)
    assert released_target({}, headroom, freed, POLICY) == AMOUNT + freed
    big = Resources(8000, 16 * GIB)
    assert released_target({}, headroom, big, POLICY) == Resources(6000, 12 * GIB)  # 3x
    assert released_target({CPU_LABEL: "1"}, headroom, freed, POLICY).cpu_millis == 3000
    assert released_target({}, NodeHeadroom(), freed, POLICY) == Resources.ZERO


# ---------------------------------------------------------------- on a real ledger


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def headroom_ledger(database: Database, clock: Clock) -> Ledger:
    ledger = Ledger(database, clock, headroom=replace(POLICY, idle_seconds=300))
    ledger.upsert_node("n1", NodeSpec(Resources(16000, 64 * GIB)))
    return ledger


def pod(uid: str) -> Holder:
    return Holder(HolderKind.POD, uid, f"default/{uid}")


def admit(ledger: Ledger, uid: str, cpu: int, *, headroom: bool = True) -> HoldingState:
    admission = ledger.admit(
        "n1", pod(uid), Resources(cpu, GIB), state=HoldingState.PENDING, headroom=headroom
    )
    return admission.holding.state


def grant(ledger: Ledger, amount: Resources) -> None:
    """What a push's read-back records (app.slurm.push)."""
    with ledger.exclusive("n1") as node:
        node.finish(amount, None)


def test_the_ledger_holds_at_once_inside_the_grant_and_records_why(
    headroom_ledger: Ledger,
) -> None:
    ledger = headroom_ledger
    assert admit(ledger, "p1", 1000) is HoldingState.PENDING  # the first: through the gate
    assert ledger.views_named(["n1"])[0].headroom.target == AMOUNT
    grant(ledger, Resources(3000, 5 * GIB))
    assert admit(ledger, "p2", 1000) is HoldingState.HELD
    assert admit(ledger, "p3", 1500) is HoldingState.PENDING  # 3.5 CPUs > 3 granted
    assert admit(ledger, "p4", 500, headroom=False) is HoldingState.PENDING  # gate closed
    admitted = ledger.events(node="n1", kind=EventKind.ADMITTED)
    within = [e.holder_id for e in admitted if e.details.get("within_headroom")]
    assert within == ["p2"]
    assert ledger.views_named(["n1"])[0].headroom.target == Resources(4000, 8 * GIB)  # grown


def test_a_push_lowers_the_grant_before_it_tells_slurm_less(headroom_ledger: Ledger) -> None:
    ledger = headroom_ledger
    grant(ledger, Resources(5000, 9 * GIB))
    with ledger.exclusive("n1") as node:
        view = node.view(grant_at_most=lambda _: Resources(2000, 2 * GIB))
        assert view.headroom.granted == Resources(2000, 2 * GIB)
        # Committed already: an admission on another connection sees the lowered grant.
        assert admit(ledger, "p1", 2500) is HoldingState.PENDING
    with ledger.exclusive("n1") as node:  # never raised by a lower limit's absence
        assert node.view().headroom.granted == Resources(2000, 2 * GIB)


def test_idle_headroom_is_given_back_once(headroom_ledger: Ledger, clock: Clock) -> None:
    ledger = headroom_ledger
    admit(ledger, "p1", 1000)
    assert ledger.settle_headroom() == []
    clock.now += timedelta(seconds=301)
    assert ledger.settle_headroom() == ["n1"]
    assert ledger.views_named(["n1"])[0].headroom.target == Resources.ZERO
    assert ledger.settle_headroom() == []
    (event,) = ledger.events(node="n1", kind=EventKind.HEADROOM)
    assert "given back to Slurm" in event.message


def test_a_node_where_slurm_jobs_wait_gives_its_headroom_back_by_its_slurm_name(
    headroom_ledger: Ledger,
) -> None:
    ledger = headroom_ledger
    ledger.upsert_node("n2", NodeSpec(Resources(16000, 64 * GIB), slurm_name="s2"))
    admit(ledger, "p1", 1000)
    ledger.admit("n2", pod("p2"), Resources(1000, GIB), state=HoldingState.PENDING, headroom=True)
    assert ledger.settle_headroom(["n2", "s9"]) == []  # n2 is "s2" to Slurm
    assert ledger.settle_headroom(["s2"]) == ["n2"]
    assert ledger.settle_headroom(["n1"]) == ["n1"]
    assert ledger.settle_headroom(["n1", "s2"]) == []
    (event,) = ledger.events(node="n1", kind=EventKind.HEADROOM)
    assert "given back to Slurm (Slurm jobs wait for resources" in event.message


def test_a_confirmed_release_stays_withheld_unless_past_the_maximum(
    headroom_ledger: Ledger,
) -> None:
    ledger = headroom_ledger
    admit(ledger, "p1", 1000)  # PENDING: the gate's
    grant(ledger, Resources(3000, 5 * GIB))
    assert admit(ledger, "p2", 1000) is HoldingState.HELD
    kept = ledger.release("p2", into_headroom=True)
    assert not kept.withheld_fell
    assert ledger.views_named(["n1"])[0].headroom.target == AMOUNT + Resources(1000, GIB)
    pending = ledger.release("p1", into_headroom=True)  # not confirmed: Slurm is told
    assert pending.withheld_fell
    assert admit(ledger, "p3", 2000) is HoldingState.HELD
    assert not ledger.release("p3", into_headroom=True).withheld_fell  # a 5 CPU target
    assert admit(ledger, "p4", 3000) is HoldingState.HELD
    assert ledger.release("p4", into_headroom=True).withheld_fell  # 5 + 3 > 6 CPUs
    assert ledger.views_named(["n1"])[0].headroom.target == Resources(6000, 7 * GIB)
