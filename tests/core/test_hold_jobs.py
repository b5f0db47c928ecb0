"""Which Slurm jobs are the ledger's hold jobs (app.core.slurm_models.LedgerHolds), as every
reader of Slurm's jobs applies it: the plan (Slurm-job holdings), the counts' usage (what
the gate checks where a count is 0), the device taints and the sweep's candidates. A name
and a comment any Slurm user can give a job; only the ledger's record of the job id and the
service's Slurm user make a job a pod's hold."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from app.core.counts import SlurmUnits, hides_usage, slurm_usage
from app.core.device_taints import DeviceId, wanted_rules
from app.core.plan import plan_node
from app.core.records import (
    HolderKind,
    Holding,
    NodeSpec,
    NodeView,
)
from app.core.resources import Resources
from app.core.slurm_models import (
    HOLD_JOB_NAME,
    RELEASED_COMMENT,
    JobAllocation,
    LedgerHolds,
    SlurmJob,
    SlurmNode,
    hold_comment,
)
from tests.support import builders

MIB = 2**20
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SERVICE = "slurm"  # the service's Slurm user (SlurmUser)
# k8sgpu at 0 (every GPU withheld): Slurm shows no use of it, the jobs tell it (hides_usage).
NODE = SlurmNode(
    "n1", 16, 32000, 0, 0, 0, "gpu:4,k8scpu:16,k8smemory:32000", "gpu:1", frozenset({"MIXED"}),
    "", "",
)  # fmt: skip


def pod(hold: str | None) -> Holding:
    """The pod the ledger holds device 0 for, with its hold job's id as recorded."""
    gpu = Resources(1000, 0, 1)
    return builders.holding(HolderKind.POD, "pod-a", gpu, at=T0, devices=(0,), slurm_hold=hold)


def hold_job(job_id: str, user: str) -> SlurmJob:
    """A job named and commented as the service's hold jobs are, on device 0."""
    return SlurmJob(
        job_id, HOLD_JOB_NAME, user, frozenset({"RUNNING"}),
        (JobAllocation("n1", 8, 8000, 1, (0,)),), hold_comment("pod-a"),
    )  # fmt: skip


CASES = [
    # (the job, the id the ledger recorded, is it the ledger's, the sweep's candidate's holder)
    pytest.param(hold_job("9", "mallory"), "8", False, None, id="forged-name-and-comment"),
    pytest.param(hold_job("8", "mallory"), "8", False, None, id="recorded-id-another-user"),
    pytest.param(hold_job("9", SERVICE), "8", False, "pod-a", id="service-user-unrecorded"),
    pytest.param(hold_job("9", SERVICE), None, False, "pod-a", id="mid-admission-unrecorded"),
    pytest.param(hold_job("8", SERVICE), "8", True, "pod-a", id="recorded-service-user"),
]


@pytest.mark.parametrize(("job", "recorded", "ledgers", "holder"), CASES)
def test_only_a_recorded_hold_of_the_services_user_is_the_ledgers(
    job: SlurmJob, recorded: str | None, ledgers: bool, holder: str | None
) -> None:
    spec = NodeSpec(Resources(16000, 32000 * MIB, 4))
    view = NodeView("n1", spec, None, None, (pod(recorded),), T0, T0)
    holds = LedgerHolds.of(SERVICE, view.holdings)
    assert holds.owns(job) is ledgers
    assert holds.holder_of(job) == holder  # the sweep ends only the service's own holds

    # The plan: any other job is a Slurm job's holding.
    plan = plan_node(view, NODE, [job], Resources.ZERO, hold_user=SERVICE)
    slurm_jobs = plan.holdings if plan.holdings is not None else {}  # None: as the view has
    assert (job.job_id in slurm_jobs) is not ledgers

    # The usage the gate checks where a count is 0.
    assert hides_usage(NODE)
    used = slurm_usage(NODE, [job], holds)
    assert used == (SlurmUnits(0, 0, 0) if ledgers else SlurmUnits(8, 8000, 1))

    # The device taints: a Slurm job's device is tainted, a pod's hold is not.
    ids = {"k1": {0: DeviceId("gpu.example.com", "k1", "gpu0")}}
    wanted, _ = wanted_rules([job], {"n1": "k1"}, ids, holds)
    assert bool(wanted) is not ledgers


def test_a_hold_made_and_not_recorded_yet_is_its_own_admissions() -> None:
    """The gate's push names the hold it just made (the ledger records it only after)."""
    job = hold_job("9", SERVICE)
    holds = LedgerHolds.of(SERVICE, [pod(None)])
    assert not holds.owns(job)
    assert holds.also("9").owns(job)
    assert holds.also(None) == holds
    assert not holds.also("9").owns(hold_job("9", "mallory"))


def test_a_hold_marked_released_is_one_the_sweep_ends() -> None:
    """A hold the service marked released and failed to cancel names no holding ("")."""
    released = replace(hold_job("9", SERVICE), comment=RELEASED_COMMENT)
    holds = LedgerHolds.of(SERVICE, [pod("8")])
    assert holds.holder_of(released) == ""
    assert holds.holder_of(replace(released, user="mallory")) is None
