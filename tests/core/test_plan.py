"""plan_node, the pure decision of the Slurm reconcile: every combination of health,
holdings and counts a node can be in, as plain data (no database, no Slurm)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from app.core.counts import K8sCounts, desired_counts, fence_kept, withheld
from app.core.plan import (
    HealthChange,
    NodePlan,
    Push,
    floored_minus,
    health_reason,
    plan_node,
    slurm_snapshot,
)
from app.core.records import (
    Holder,
    HolderKind,
    Holding,
    HoldingState,
    NodeSpec,
    NodeView,
    SnapshotEntry,
)
from app.core.resources import Resources
from app.core.slurm_models import JobAllocation, LedgerHolds, SlurmJob, SlurmNode
from tests.support import builders

MIB = 2**20
T0 = datetime(2026, 1, 1, tzinfo=UTC)
FULL = "k8scpu:16,k8smemory:32000"


def node(**changes: object) -> SlurmNode:
    n = SlurmNode("n1", 16, 32000, 0, 0, 0, FULL, "", frozenset({"IDLE"}), "", "")
    return replace(n, **changes)  # type: ignore[arg-type]


def job(job_id: str = "7", on: str = "n1", cpus: int = 2, user: str = "alice") -> SlurmJob:
    return SlurmJob(
        job_id, "train", user, frozenset({"RUNNING"}), (JobAllocation(on, cpus, 1000, 0),)
    )


def holding(kind: HolderKind, holder_id: str, cpus: int, mb: int = 0) -> Holding:
    return builders.holding(kind, holder_id, Resources(cpus * 1000, mb * MIB), at=T0)


def view(*holdings: Holding, health: str | None = None, alias: str | None = None) -> NodeView:
    spec = NodeSpec(capacity=Resources(16000, 32000 * MIB), slurm_name=alias)
    return builders.node_view(spec, *holdings, health=health, at=T0)


JOB_7 = holding(HolderKind.SLURM_JOB, "7", 2, 1000)
POD = holding(HolderKind.POD, "u1", 2, 1024)
MANUAL = holding(HolderKind.MANUAL, "m1", 1)
HOLD_7 = {"7": SnapshotEntry("train (alice)", Resources(2000, 1000 * MIB))}
LOWERED = "k8scpu:14,k8smemory:30976"


@pytest.mark.parametrize(
    ("ledger", "slurm", "jobs", "unlisted", "expected"),
    [
        pytest.param(view(), node(), [], Resources.ZERO, NodePlan(None, None, None), id="in-place"),
        pytest.param(
            view(),
            None,
            [],
            Resources.ZERO,
            NodePlan(HealthChange("Slurm has no node 'n1'"), None, None),
            id="not-in-slurm",
        ),
        pytest.param(
            view(POD, health="Slurm has no node 'n1'"),
            None,
            [],
            Resources.ZERO,
            NodePlan(None, None, None),
            id="not-in-slurm-already-said-nothing-pushed",
        ),
        pytest.param(
            view(),
            node(states=frozenset({"IDLE", "DRAIN"}), reason="disk"),
            [],
            Resources.ZERO,
            NodePlan(HealthChange("Slurm node n1 is DRAIN+IDLE: disk"), None, None),
            id="drained",
        ),
        pytest.param(
            view(health="Slurm node n1 is DOWN"),
            node(),
            [],
            Resources.ZERO,
            NodePlan(HealthChange(None), None, None),
            id="healthy-again",
        ),
        pytest.param(
            view(), node(), [job()], Resources.ZERO, NodePlan(None, HOLD_7, None), id="job-came"
        ),
        pytest.param(
            view(JOB_7), node(), [job()], Resources.ZERO, NodePlan(None, None, None), id="job-held"
        ),
        pytest.param(
            view(JOB_7), node(), [], Resources.ZERO, NodePlan(None, {}, None), id="job-went"
        ),
        pytest.param(
            view(JOB_7),
            node(),
            [job(cpus=4)],
            Resources.ZERO,
            NodePlan(
                None, {"7": SnapshotEntry("train (alice)", Resources(4000, 1000 * MIB))}, None
            ),
            id="job-changed",
        ),
        pytest.param(
            view(),
            node(),
            [job(on="n2")],
            Resources.ZERO,
            NodePlan(None, None, None),
            id="job-elsewhere",
        ),
        pytest.param(
            view(),
            node(),
            [job(user="")],
            Resources.ZERO,
            NodePlan(None, {"7": SnapshotEntry("train", Resources(2000, 1000 * MIB))}, None),
            id="job-without-user",
        ),
        pytest.param(
            view(),
            node(),
            [],
            Resources(3000),
            NodePlan(
                None,
                {"node:n1": SnapshotEntry("allocated, no job listed yet", Resources(3000))},
                None,
            ),
            id="allocated-no-job-listed",
        ),
        pytest.param(
            view(POD),
            node(),
            [],
            Resources.ZERO,
            NodePlan(None, None, Push("n1")),
            id="pod-not-withheld-push",
        ),
        pytest.param(
            view(POD),
            node(gres=LOWERED),
            [],
            Resources.ZERO,
            NodePlan(None, None, None),
            id="pod-withheld",
        ),
        pytest.param(
            view(MANUAL, JOB_7),
            node(),
            [job()],
            Resources.ZERO,
            NodePlan(None, None, Push("n1")),
            id="manual-withheld-jobs-not",
        ),
        pytest.param(
            view(),
            node(gres=LOWERED),
            [],
            Resources.ZERO,
            NodePlan(None, None, Push("n1")),
            id="pod-gone-push-back",
        ),
        pytest.param(
            view(POD, health="old"),
            node(states=frozenset({"DOWN"})),
            [job()],
            Resources.ZERO,
            NodePlan(
                HealthChange("Slurm node n1 is DOWN"),
                HOLD_7,
                Push("n1"),
            ),
            id="all-three",
        ),
    ],
)
def test_plan(
    ledger: NodeView,
    slurm: SlurmNode | None,
    jobs: list[SlurmJob],
    unlisted: Resources,
    expected: NodePlan,
) -> None:
    plan = plan_node(ledger, slurm, jobs, unlisted, hold_user="slurm")
    assert plan == expected
    assert plan.settled == (expected == NodePlan(None, None, None))


def test_an_aliased_node_is_planned_by_its_slurm_name() -> None:
    aliased = view(POD, alias="c1")
    slurm = node(name="c1")
    unlisted = plan_node(aliased, None, [], hold_user="slurm")
    assert unlisted.health == HealthChange("Slurm has no node 'c1'")
    plan = plan_node(aliased, slurm, [job(on="c1")], hold_user="slurm")
    assert plan.holdings == HOLD_7
    assert plan.push == Push("c1")


def test_a_node_with_gpus_plans_k8sgpu() -> None:
    gpu_pod = Holding(
        "n1", Holder(HolderKind.POD, "g"), Resources(0, 0, 1), HoldingState.HELD, T0, T0
    )
    gpu_node = node(gres=f"gpu:4,{FULL},k8sgpu:4")
    assert plan_node(view(gpu_pod), gpu_node, [], hold_user="slurm").push == Push("n1")
    # What the pusher pushes then (it computes the counts under the node's lock).
    assert desired_counts(gpu_node, withheld(view(gpu_pod))) == K8sCounts(16, 32000, 3)


@pytest.mark.parametrize(
    ("states", "reason", "expected"),
    [
        pytest.param({"IDLE"}, "", None, id="idle"),
        pytest.param({"MIXED"}, "", None, id="mixed"),
        pytest.param({"ALLOCATED", "COMPLETING"}, "", None, id="completing"),
        pytest.param({"IDLE", "DRAIN"}, "disk", "Slurm node n1 is DRAIN+IDLE: disk", id="drain"),
        pytest.param(
            {"DOWN", "NOT_RESPONDING"}, "", "Slurm node n1 is DOWN+NOT_RESPONDING", id="down"
        ),
        pytest.param(
            {"IDLE", "INVALID_REG"}, "", "Slurm node n1 is IDLE+INVALID_REG", id="invalid-reg"
        ),
        pytest.param({"INVALID"}, "", "Slurm node n1 is INVALID", id="invalid"),
        pytest.param({"FAIL", "MIXED"}, "x", "Slurm node n1 is FAIL+MIXED: x", id="fail"),
    ],
)
def test_health_reason(states: set[str], reason: str, expected: str | None) -> None:
    assert health_reason(node(states=frozenset(states), reason=reason), "n1") == expected


def test_unlisted_defaults_to_what_the_node_reports_beyond_its_jobs() -> None:
    busy = node(alloc_cpus=3, alloc_memory_mb=500, gres="gpu:2", gres_used="gpu:1")
    assert slurm_snapshot(busy, [job()], LedgerHolds("slurm")) == {
        **HOLD_7,
        "node:n1": SnapshotEntry("allocated, no job listed yet", Resources(1000, 0, 1)),
    }


def test_floored_minus_never_goes_below_zero() -> None:
    assert floored_minus(Resources(1000, 5, 1), Resources(2000, 3, 1)) == Resources(0, 2, 0)


LATER = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("pod_confirmed", "listed_at", "job_cpus", "deferred"),
    [
        # The listing began before the pod was confirmed and its job no longer fits beside it:
        # the job ended since (Slurm confirmed the pod into what it freed), so wait.
        pytest.param(LATER, T0, 10, True, id="stale-listing-overcommits"),
        pytest.param(T0, LATER, 10, False, id="listing-newer-than-the-pod"),
        pytest.param(LATER, T0, 2, False, id="stale-listing-that-fits"),
        pytest.param(LATER, None, 10, False, id="no-listing-time"),
    ],
)
def test_jobs_of_a_listing_older_than_the_pod_they_would_overcommit_wait(
    pod_confirmed: datetime, listed_at: datetime | None, job_cpus: int, deferred: bool
) -> None:
    """The spurious "overcommitted" of issue 30: the sync applied a job listing read just
    before a pod was confirmed into what a listed job freed, so the ledger counted both and
    refused every admission on the node until the next listing."""
    pod = replace(holding(HolderKind.POD, "u1", 8, 1024), updated_at=pod_confirmed)
    ledger = view(pod)
    plan = plan_node(
        ledger, node(), [job(cpus=job_cpus)], Resources.ZERO, listed_at=listed_at, hold_user="slurm"
    )
    assert plan.deferred is deferred
    assert (plan.holdings is None) is deferred
    assert not plan.settled


GPUS = f"gpu:g0:1,gpu:g1:1,gpu:g2:1,gpu:g3:1,{FULL},k8sgpu:4"
# A pod with a GPU but no device named: its count only, whatever the node's state.
GPU_COUNT_POD = Holding(
    "n1", Holder(HolderKind.POD, "p"), Resources(0, 0, 1), HoldingState.HELD, T0, T0
)


def device_pod(hold: str | None, confirmed: datetime = T0) -> Holding:
    gpu = Resources(1000, 0, 1)
    return builders.holding(
        HolderKind.POD, "gpu-pod", gpu, at=confirmed, devices=(0,), slurm_hold=hold
    )


def gpu_view(*holdings: Holding, health: str | None = None) -> NodeView:
    spec = NodeSpec(capacity=Resources(16000, 32000 * MIB, 4))
    return builders.node_view(spec, *holdings, health=health, at=T0)


def hold_job(job_id: str = "8") -> SlurmJob:
    return SlurmJob(
        job_id, "nodeledger-hold", "slurm", frozenset({"RUNNING"}),
        (JobAllocation("n1", 1, 1, 1, (0,)),), "nodeledger-hold:gpu-pod",
    )  # fmt: skip


# Killed with its node, or cancelled: ending, though Slurm still lists it.
COMPLETING_HOLD = replace(hold_job(), states=frozenset({"COMPLETING"}))


@pytest.mark.parametrize(
    ("pod", "jobs", "listed_at", "gone"),
    [
        pytest.param(device_pod("8"), [hold_job()], LATER, False, id="hold-listed"),
        pytest.param(device_pod("8"), [], LATER, True, id="hold-gone"),
        pytest.param(device_pod("8"), [hold_job("9")], LATER, True, id="another-hold-listed"),
        pytest.param(device_pod("8"), [COMPLETING_HOLD], LATER, True, id="hold-completing"),
        # Confirmed after the listing began: the listing may predate its hold.
        pytest.param(device_pod("8", LATER), [], T0, False, id="hold-newer-than-listing"),
        pytest.param(device_pod("8"), [], None, False, id="no-listing-time"),
        pytest.param(device_pod(None), [], LATER, False, id="no-hold-recorded"),
    ],
)
def test_a_gpu_pod_whose_hold_job_is_gone_makes_the_node_not_admissible(
    pod: Holding, jobs: list[SlurmJob], listed_at: datetime | None, gone: bool
) -> None:
    plan = plan_node(gpu_view(pod), node(gres=GPUS), jobs, listed_at=listed_at, hold_user="slurm")
    if not gone:
        assert plan.health is None
        return
    assert plan.health is not None
    assert plan.health.reason is not None
    assert plan.health.reason.startswith("Slurm hold jobs of GPU devices gone")
    assert "gpu-pod (devices [0], job 8)" in plan.health.reason


@pytest.mark.parametrize(
    ("health", "holding", "k8sgpu"),
    [
        pytest.param(None, device_pod("8"), 3, id="healthy"),
        pytest.param("Slurm node n1 is DOWN", device_pod("8"), 0, id="down"),
        pytest.param("Slurm hold jobs of GPU devices gone", device_pod("8"), 0, id="hold-gone"),
        pytest.param("Slurm node n1 is DOWN", GPU_COUNT_POD, 3, id="down-no-devices"),
    ],
)
def test_every_gpu_is_withheld_while_a_node_with_device_pods_is_not_admissible(
    health: str | None, holding: Holding, k8sgpu: int
) -> None:
    """Slurm ends or may end the hold jobs there; on a node that comes back it starts a
    queued job at once on the lowest free device (issue 30)."""
    ledger, slurm = gpu_view(holding, health=health), node(gres=GPUS)
    assert plan_node(ledger, slurm, [hold_job()], hold_user="slurm").push == Push("n1")
    assert desired_counts(slurm, withheld(ledger)).k8sgpu == k8sgpu  # what the pusher sends


FENCED = GPUS.replace("k8sgpu:4", "k8sgpu:0")  # prep/k8s_gpu_fence: a hold job ended


@pytest.mark.parametrize(
    ("holding", "read", "listed", "k8sgpu"),
    [
        pytest.param(device_pod("8"), FENCED, None, 0, id="fenced-kept"),
        pytest.param(device_pod("8"), FENCED, GPUS, 0, id="fenced-after-the-listing"),
        pytest.param(device_pod("8"), FENCED, FENCED, 3, id="the-listing-saw-it"),
        pytest.param(device_pod("8"), GPUS, None, 3, id="not-fenced"),
        pytest.param(GPU_COUNT_POD, FENCED, None, 3, id="no-devices-held"),
    ],
)
def test_a_push_keeps_every_gpu_withheld_until_a_listing_saw_the_fence(
    holding: Holding, read: str, listed: str | None, k8sgpu: int
) -> None:
    """The plugin withholds every GPU when a hold job ends; a push computed from a ledger
    that still has the hold must not give them back (a queued job would take the pod's
    device): only a push after a listing that found the node so (its plan knows)."""
    ledger = gpu_view(holding)
    observed = node(gres=listed) if listed is not None else None
    held = fence_kept(ledger, withheld(ledger), node(gres=read), observed)
    assert desired_counts(node(gres=GPUS), held).k8sgpu == k8sgpu
