"""GPU device holdings through the Slurm gate (issue 23), with a fake slurmrestd and fake hold
jobs on a real ledger: the one Slurm call is the hold, the counts leave the holding out, a
release ends the hold, and the sync ends holds that no holding names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.admission.service import Admissions
from app.core.caps import KubeCaps
from app.core.counts import withheld
from app.core.ledger_errors import AdmissionRejected
from app.core.records import Holder, HolderKind, Holding, HoldingState, NodeSpec
from app.core.resources import Resources
from app.ledger.service import Ledger
from app.slurm.errors import SlurmUnavailable
from app.slurm.gate import SlurmGate
from app.slurm.hold_sweep import lost, orphans
from app.slurm.holds import HoldJob
from app.slurm.push import Pusher
from tests.slurm.test_push_coalescing import GIB, FakeSlurm, slurm_node

POD = Holder(HolderKind.POD, "uid-1", "ns/p1")


class FakeHolds:
    """HoldJobs as slurmctld answers it: a device held twice is refused."""

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


def admissions_with(ledger: Ledger, holds: FakeHolds, *, fail_open: bool = False) -> Admissions:
    fake = FakeSlurm(slurm_node(gres="k8scpu:16,k8smemory:32000,k8sgpu:4,gpu:4"))
    gate = SlurmGate(Pusher(fake, ledger), KubeCaps(), holds=holds, fail_open=fail_open)  # type: ignore[arg-type]
    return Admissions(ledger, gate)


def test_a_device_admission_is_held_by_one_hold_job_and_left_out_of_the_counts(
    gpu_ledger: Ledger,
) -> None:
    holds = FakeHolds()
    admissions = admissions_with(gpu_ledger, holds)
    admitted = admissions.admit("n1", POD, Resources(1500, GIB, 1), devices=(2,))
    assert admitted.holding.state is HoldingState.HELD
    assert admitted.holding.slurm_hold == "100"
    assert holds.held == {"100": ("uid-1", (2,), 2, 1024)}  # whole CPUs and MiB, rounded up
    # The hold job asks Slurm for the pod's share; the counts must not withhold it again.
    assert withheld(gpu_ledger.get_node("n1")).as_resources() == Resources.ZERO


def test_a_device_slurm_holds_is_refused_and_the_hold_undone(gpu_ledger: Ledger) -> None:
    holds = FakeHolds()
    holds.held["7"] = ("job", (2,), 1, 1)  # a Slurm job has device 2
    admissions = admissions_with(gpu_ledger, holds)
    with pytest.raises(AdmissionRejected, match="busy"):
        admissions.admit("n1", POD, Resources(1000, GIB, 1), devices=(2,))
    assert gpu_ledger.list_holdings("n1") == []


def test_device_holds_fail_closed_even_with_fail_open(gpu_ledger: Ledger) -> None:
    holds = FakeHolds()
    holds.down = True
    admissions = admissions_with(gpu_ledger, holds, fail_open=True)
    with pytest.raises(AdmissionRejected, match="cannot hold GPU devices"):
        admissions.admit("n1", POD, Resources(1000, GIB, 1), devices=(0,))
    assert gpu_ledger.list_holdings("n1") == []


def test_a_release_ends_the_hold_job(gpu_ledger: Ledger) -> None:
    holds = FakeHolds()
    admissions = admissions_with(gpu_ledger, holds)
    admissions.admit("n1", POD, Resources(1000, GIB, 1), devices=(1,))
    released = admissions.release("uid-1")
    assert released.slurm_hold == "100"
    assert holds.cancelled == ["100"]
    assert holds.held == {}


def _holding(holder: str, state: HoldingState, hold: str | None) -> Holding:
    at = datetime(2026, 11, 25, tzinfo=UTC)
    resources = Resources(1000, GIB, 1)
    pod = Holder(HolderKind.POD, holder)
    return Holding("n1", pod, resources, state, at, at, (0,), hold)


@pytest.mark.parametrize(
    ("holdings", "orphaned"),
    [
        pytest.param([], ["1"], id="no holding: orphan"),
        pytest.param([_holding("a", HoldingState.HELD, "1")], [], id="named by its holding"),
        pytest.param([_holding("a", HoldingState.HELD, "9")], ["1"], id="holding names another"),
        pytest.param([_holding("a", HoldingState.PENDING, None)], [], id="admission in flight"),
        pytest.param([_holding("a", HoldingState.PENDING, "9")], ["1"], id="pending, other hold"),
    ],
)
def test_orphaned_holds(holdings: list[Holding], orphaned: list[str]) -> None:
    hold = HoldJob("1", "a", "n1", (0,))
    assert [h.job_id for h in orphans([hold], holdings)] == orphaned


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
