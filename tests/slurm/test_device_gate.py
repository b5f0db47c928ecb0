"""GPU device holdings through the Slurm gate (issue 23), with a fake slurmrestd and fake hold
jobs on a real ledger: the hold, then the counts withholding the holding too (issue 30), a
release ends the hold, and the sync ends holds that no holding names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.admission.service import AdmissionRequest, Admissions, ReleaseRequest
from app.core.caps import KubeCaps
from app.core.counts import SlurmUnits, withheld
from app.core.ledger_errors import AdmissionRejected
from app.core.records import HeldDevice, Holder, HolderKind, Holding, HoldingState, NodeSpec
from app.core.resources import Resources
from app.core.slurm_models import JobAllocation, SlurmJob, hold_comment
from app.ledger.service import Ledger
from app.slurm.errors import SlurmUnavailable
from app.slurm.gate import SlurmGate
from app.slurm.hold_sweep import HoldSweep, lost, orphans
from app.slurm.holds import HoldJob
from app.slurm.push import Pusher
from tests.support import builders
from tests.support.fake_slurm import GIB, FakeSlurm, slurm_node
from tests.support.slurm_cluster import k8s_counts

POD = Holder(HolderKind.POD, "uid-1", "ns/p1")


class FakeHolds:
    """HoldJobs as slurmctld answers it: a device held twice is refused."""

    user = "slurm"

    def __init__(self) -> None:
        self.held: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        self.cancelled: list[str] = []
        self.down = False

    def hold(
        self,
        node: str,
        holder_id: str,
        *,
        devices: tuple[int, ...],
        cpus: int,
        memory_mb: int,
    ) -> str:
        if self.down:
            raise SlurmUnavailable("slurmrestd away")
        if any(set(devices) & set(d) for _, d, _, _ in self.held.values()):
            raise AdmissionRejected(f"Slurm node {node}: Requested nodes are busy")
        job = str(100 + len(self.held) + len(self.cancelled))
        self.held[job] = (holder_id, devices, cpus, memory_mb)
        return job

    def cancel(self, job_id: str, *, slurm_node: str | None = None) -> None:
        self.held.pop(job_id, None)
        self.cancelled.append(job_id)


@pytest.fixture
def gpu_ledger(ledger: Ledger) -> Ledger:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20, 4)))
    return ledger


def admissions_with(
    ledger: Ledger, holds: FakeHolds, *, fail_open: bool = False, fake: FakeSlurm | None = None
) -> Admissions:
    fake = fake or FakeSlurm(slurm_node(gres="k8scpu:16,k8smemory:32000,k8sgpu:4,gpu:4"))
    gate = SlurmGate(Pusher(fake, ledger), KubeCaps(), holds=holds, fail_open=fail_open)  # type: ignore[arg-type]
    return Admissions(ledger, gate)


def test_a_device_admission_is_held_by_one_hold_job_and_withheld_by_the_counts(
    gpu_ledger: Ledger,
) -> None:
    holds = FakeHolds()
    fake = FakeSlurm(slurm_node(gres="k8scpu:16,k8smemory:32000,k8sgpu:4,gpu:4"))
    admissions = admissions_with(gpu_ledger, holds, fake=fake)
    admitted = admissions.admit(
        AdmissionRequest("n1", POD, Resources(1500, GIB, 1), devices=(HeldDevice(2),))
    )
    assert admitted.holding.state is HoldingState.HELD
    assert admitted.holding.slurm_hold == "100"
    assert holds.held == {"100": ("uid-1", (2,), 1, 1)}  # the least a job can have
    # The counts withhold the pod's CPUs, memory and GPU count (issue 30): a hold that ends
    # (scancel, a time limit, a node DOWN) exposes none of them; pushed before the answer.
    assert withheld(gpu_ledger.get_node("n1")) == SlurmUnits(2, 1024, 1)
    assert k8s_counts(fake.node.gres) == {"k8scpu": 14, "k8smemory": 30976, "k8sgpu": 3}
    admissions.release(ReleaseRequest("uid-1"))
    assert k8s_counts(fake.node.gres) == {"k8scpu": 16, "k8smemory": 32000, "k8sgpu": 4}


def test_a_device_admission_slurm_already_uses_is_refused_and_its_hold_ended(
    gpu_ledger: Ledger,
) -> None:
    holds = FakeHolds()
    # Slurm's jobs use 15 CPUs already: the pod's 2 do not fit beside them.
    used = "k8scpu:15,k8smemory:0,k8sgpu:0"
    fake = FakeSlurm(slurm_node(gres="k8scpu:16,k8smemory:32000,k8sgpu:4,gpu:4", gres_used=used))
    admissions = admissions_with(gpu_ledger, holds, fake=fake)
    with pytest.raises(AdmissionRejected, match="cpu"):
        admissions.admit(
            AdmissionRequest("n1", POD, Resources(1500, GIB, 1), devices=(HeldDevice(2),))
        )
    assert holds.cancelled == ["100"]
    assert holds.held == {}
    assert gpu_ledger.list_holdings("n1") == []


def test_a_device_slurm_holds_is_refused_and_the_hold_undone(gpu_ledger: Ledger) -> None:
    holds = FakeHolds()
    holds.held["7"] = ("job", (2,), 1, 1)  # a Slurm job has device 2
    admissions = admissions_with(gpu_ledger, holds)
    with pytest.raises(AdmissionRejected, match="busy"):
        admissions.admit(
            AdmissionRequest("n1", POD, Resources(1000, GIB, 1), devices=(HeldDevice(2),))
        )
    assert gpu_ledger.list_holdings("n1") == []


def test_device_holds_fail_closed_even_with_fail_open(gpu_ledger: Ledger) -> None:
    holds = FakeHolds()
    holds.down = True
    admissions = admissions_with(gpu_ledger, holds, fail_open=True)
    with pytest.raises(AdmissionRejected, match="cannot hold GPU devices"):
        admissions.admit(
            AdmissionRequest("n1", POD, Resources(1000, GIB, 1), devices=(HeldDevice(0),))
        )
    assert gpu_ledger.list_holdings("n1") == []


def test_a_release_ends_the_hold_job(gpu_ledger: Ledger) -> None:
    holds = FakeHolds()
    admissions = admissions_with(gpu_ledger, holds)
    admissions.admit(AdmissionRequest("n1", POD, Resources(1000, GIB, 1), devices=(HeldDevice(1),)))
    released = admissions.release(ReleaseRequest("uid-1"))
    assert released.slurm_hold == "100"
    assert holds.cancelled == ["100"]
    assert holds.held == {}


AT = datetime(2026, 11, 25, tzinfo=UTC)


def _holding(holder: str, state: HoldingState, hold: str | None) -> Holding:
    resources = Resources(1000, GIB, 1)
    return builders.holding(
        HolderKind.POD, holder, resources, state=state, at=AT, devices=(0,), slurm_hold=hold
    )


def _counted(holder: str) -> Holding:
    return builders.holding(HolderKind.POD, holder, Resources(2000, GIB, 1), at=AT)


def _manual(holder: str, hold: str) -> Holding:
    resources = Resources(1000, GIB, 1)
    return builders.holding(
        HolderKind.MANUAL, holder, resources, at=AT, devices=(1,), slurm_hold=hold
    )


@pytest.mark.parametrize(
    ("holdings", "orphaned"),
    [
        pytest.param([], ["1"], id="no holding: orphan"),
        pytest.param([_holding("a", HoldingState.HELD, "1")], [], id="named by its holding"),
        pytest.param([_holding("a", HoldingState.HELD, "9")], ["1"], id="holding names another"),
        pytest.param([_holding("a", HoldingState.PENDING, None)], [], id="admission in flight"),
        pytest.param([_holding("a", HoldingState.PENDING, "9")], ["1"], id="pending, other hold"),
        # Issue 30: the pod's holding replaced by a counted one (in-place resize, a bind whose
        # answer was lost, a ledger rebuilt) while the pod runs on the device: kept.
        pytest.param([_counted("a")], [], id="replaced without devices"),
        # A pod and a manual holding sharing an id, each with its hold: neither is an orphan.
        pytest.param(
            [_holding("a", HoldingState.HELD, "1"), _manual("a", "2")], [], id="pod and manual"
        ),
        pytest.param(
            [_manual("a", "2"), _holding("a", HoldingState.HELD, "1")], [], id="manual and pod"
        ),
    ],
)
def test_orphaned_holds(holdings: list[Holding], orphaned: list[str]) -> None:
    holds = [HoldJob("1", "a", "n1", (0,))]
    if any(h.holder.kind is HolderKind.MANUAL for h in holdings):
        holds.append(HoldJob("2", "a", "n1", (1,)))
    assert [h.job_id for h in orphans(holds, holdings)] == orphaned


def _hold_listed(job_id: str, holder: str, *, state: str = "RUNNING") -> SlurmJob:
    devices = () if state == "COMPLETING" else (0,)
    allocation = JobAllocation("n1", 2, 1, 1, devices)
    return SlurmJob(job_id, "nodeledger-hold", "slurm", frozenset({state}), (allocation,),
                    hold_comment(holder))  # fmt: skip


def test_a_hold_is_ended_once_two_listings_show_it_orphaned_and_only_once(
    gpu_ledger: Ledger,
) -> None:
    # A release deletes its holding a moment before its own cancel: a sweep in between must
    # not cancel (and warn) too; a real orphan is ended at the next listing, and a hold
    # already COMPLETING (cancelled, its epilog under way) is never cancelled again.
    holds = FakeHolds()
    sweep = HoldSweep(holds, gpu_ledger)  # type: ignore[arg-type]
    assert sweep.sweep([_hold_listed("7", "gone")]) == []
    assert holds.cancelled == []
    assert sweep.sweep([_hold_listed("7", "gone")]) == []
    assert holds.cancelled == ["7"]
    for _ in range(3):
        assert sweep.sweep([_hold_listed("7", "gone", state="COMPLETING")]) == []
    assert holds.cancelled == ["7"]
    # Seen orphaned, then gone from a listing, then back: counted afresh.
    sweep.sweep([_hold_listed("8", "gone")])
    sweep.sweep([])
    sweep.sweep([_hold_listed("8", "gone")])
    assert holds.cancelled == ["7"]


def test_lost_skips_a_holding_without_devices() -> None:
    # A holding that names a hold but no devices (replaced meanwhile) cannot be held again:
    # a hold names at least one device, and HoldJobs.hold would raise ValueError.
    at = datetime(2026, 11, 25, tzinfo=UTC)
    pod = Holder(HolderKind.POD, "a")
    holding = Holding("n1", pod, Resources(1000, GIB, 1), HoldingState.HELD, at, at, (), "9")
    assert lost([holding], [], at + timedelta(seconds=1)) == []


@pytest.mark.parametrize(
    ("hold", "confirmed_before_listing", "is_lost"),
    [
        pytest.param("1", True, False, id="listed"),
        pytest.param("9", True, True, id="not listed: lost"),
        pytest.param("9", False, False, id="confirmed after the listing began"),
    ],
)
def test_lost_holds(hold: str, confirmed_before_listing: bool, is_lost: bool) -> None:
    holding = _holding("a", HoldingState.HELD, hold)
    listed_at = holding.updated_at + timedelta(seconds=1 if confirmed_before_listing else -1)
    found = lost([holding], [HoldJob("1", "a", "n1", (0,))], listed_at)
    assert found == ([holding] if is_lost else [])
