"""The pure core: free, shortfalls, admissibility (the verdict) and snapshot diffs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.arithmetic import Shortfall, diff_snapshot, shortfalls
from app.core.records import HolderKind, Holding, NodeSpec, NodeView
from app.core.resources import Resources
from app.core.verdict import verdict
from tests.support.builders import holding, node_view

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GiB = 2**30


def node(
    capacity: Resources,
    *holdings: Holding,
    reserved: Resources = Resources.ZERO,
    cordon: str | None = None,
    health: str | None = None,
) -> NodeView:
    spec = NodeSpec(capacity, reserved)
    return node_view(spec, *holdings, cordon=cordon, health=health, at=T0)


SHORTFALLS = [
    ("fits exactly", Resources(1000, GiB, 1), Resources(1000, GiB, 1), ()),
    ("cpu short", Resources(1001, 0, 0), Resources(1000, GiB, 0), (Shortfall("cpu", 1001, 1000),)),
    (
        "all short",
        Resources(2, 2, 2),
        Resources(1, 1, 1),
        (Shortfall("cpu", 2, 1), Shortfall("memory", 2, 1), Shortfall("gpu", 2, 1)),
    ),
    (
        "zero request fits negative free?",
        Resources.ZERO,
        Resources(-1, 0, 0),
        (Shortfall("cpu", 0, -1),),
    ),
]


@pytest.mark.parametrize(
    ("requested", "free", "expected"), [s[1:] for s in SHORTFALLS], ids=[s[0] for s in SHORTFALLS]
)
def test_shortfalls(requested: Resources, free: Resources, expected: tuple[Shortfall, ...]) -> None:
    assert shortfalls(requested, free) == expected


def test_free_is_capacity_minus_reserved_minus_holdings() -> None:
    view = node(
        Resources(8000, 16 * GiB, 2),
        holding(HolderKind.POD, "p", Resources(1500, 2 * GiB, 1)),
        holding(HolderKind.SLURM_JOB, "1", Resources(2000, 4 * GiB, 0)),
        holding(HolderKind.MANUAL, "m", Resources(500, 0, 0)),
        reserved=Resources(1000, GiB, 0),
    )
    assert view.free == Resources(3000, 9 * GiB, 1)
    assert view.held_by_kubernetes == Resources(1500, 2 * GiB, 1)
    assert view.held_by_slurm == Resources(2000, 4 * GiB, 0)
    assert view.held_manually == Resources(500, 0, 0)
    assert view.held == Resources(4000, 6 * GiB, 1)
    assert view.admissible
    emptied = replace(view, holdings=())  # the sums, computed once, follow the holdings
    assert (emptied.held, emptied.free) == (Resources.ZERO, Resources(7000, 15 * GiB, 2))
    assert emptied == node(Resources(8000, 16 * GiB, 2), reserved=Resources(1000, GiB, 0))


ADMISSIBILITY = [
    ("healthy", None, None, Resources.ZERO, None),
    ("cordoned", "maintenance", None, Resources.ZERO, "maintenance"),
    ("slurm drain", None, "slurm state DRAIN", Resources.ZERO, "slurm state DRAIN"),
    ("both", "maintenance", "slurm DOWN", Resources.ZERO, "maintenance; slurm DOWN"),
    ("overcommitted", None, None, Resources(9000, 0, 0), "overcommitted"),
]


@pytest.mark.parametrize(
    ("cordon", "health", "slurm_held", "reason"),
    [a[1:] for a in ADMISSIBILITY],
    ids=[a[0] for a in ADMISSIBILITY],
)
def test_admissibility(
    cordon: str | None, health: str | None, slurm_held: Resources, reason: str | None
) -> None:
    view = node(
        Resources(8000, GiB, 0),
        holding(HolderKind.SLURM_JOB, "1", slurm_held),
        cordon=cordon,
        health=health,
    )
    assert (view.not_admissible_reason or None) == reason or reason in (
        view.not_admissible_reason or ""
    )
    assert view.admissible is (reason is None)
    assert verdict(view, Resources(1, 0, 0)).admitted is (reason is None)


def test_diff_snapshot() -> None:
    a, b = Resources(1, 1, 0), Resources(2, 2, 0)
    diff = diff_snapshot({"1": a, "2": a, "3": a}, {"2": a, "3": b, "4": b})
    assert (diff.added, diff.removed, diff.changed) == (("4",), ("1",), ("3",))
    assert diff_snapshot({"1": a}, {"1": a}).is_empty


amounts = st.builds(Resources, st.integers(0, 10**6), st.integers(0, 2**40), st.integers(0, 8))


@given(capacity=amounts, requests=st.lists(amounts, max_size=20))
def test_greedy_admission_never_exceeds_capacity(
    capacity: Resources, requests: list[Resources]
) -> None:
    """Admitting whatever fits, in any order, never overcommits."""
    holdings: list[Holding] = []
    for i, r in enumerate(requests):
        if verdict(node(capacity, *holdings), r).admitted:
            holdings.append(holding(HolderKind.POD, str(i), r))
    view = node(capacity, *holdings)
    assert view.held.fits_within(capacity)
    assert view.free.is_nonnegative()
