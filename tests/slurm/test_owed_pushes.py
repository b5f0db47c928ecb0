"""A push that failed leaves its node owed, and the sync pushes it once Slurm answers again,
even though nothing changed in Slurm (its listings answer 304). A fake slurmrestd, a real
SQLite ledger; tests/slurm/test_failures.py proves the same against the real cluster."""

from __future__ import annotations

from app.admission.service import AdmissionRequest, Admissions
from app.core.caps import KubeCaps
from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.slurm.gate import SlurmGate
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from app.slurm.sync import FULL_PASS_EVERY, SlurmSync
from tests.support.fake_slurm import UnchangedSlurm, slurm_node

GIB = 1024**3


def test_a_fail_open_admission_is_pushed_by_the_next_sync_step_that_reaches_slurm(
    ledger: Ledger,
) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    slurm = UnchangedSlurm(slurm_node())
    pusher = Pusher(slurm, ledger)  # type: ignore[arg-type]
    holds = HoldJobs(slurm)  # type: ignore[arg-type]
    sync = SlurmSync(slurm, ledger, pusher, holds=holds)  # type: ignore[arg-type]
    admissions = Admissions(ledger, SlurmGate(pusher, KubeCaps(), holds=holds, fail_open=True))
    sync.step()  # the first, full pass

    slurm.down = True
    admissions.admit(AdmissionRequest("n1", Holder(HolderKind.POD, "u1"), Resources(2000, GIB)))
    assert pusher.owed() == ["n1"]
    sync.step()  # unreachable: still owed
    assert pusher.owed() == ["n1"]
    assert sync.health().status == "degraded"

    slurm.down = False
    sync.step()  # Slurm answers 304 for both listings: only the owed node is pushed
    assert slurm.node.gres == "k8scpu:14,k8smemory:30976"  # 32000 MiB - 1 GiB
    assert pusher.owed() == []
    assert sync.health().status == "ok"


def test_a_pod_recorded_behind_the_syncs_back_is_pushed_by_its_periodic_pass(
    ledger: Ledger,
) -> None:
    """Another replica recorded the pod and died before pushing: nothing in Slurm changed,
    and no push is owed here. The pass every FULL_PASS_EVERY steps compares that node again:
    its view is not the one its last compare found in place."""
    for name in ("n1", "n2"):
        ledger.upsert_node(name, NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    slurm = UnchangedSlurm(slurm_node())
    pusher = Pusher(slurm, ledger)  # type: ignore[arg-type]
    holds = HoldJobs(slurm)  # type: ignore[arg-type]
    sync = SlurmSync(slurm, ledger, pusher, holds=holds, views=NodeSnapshot(ledger))
    sync.step()  # the first, full pass: n2 is not in Slurm's listing, n1 is in place
    ledger.record("n1", Holder(HolderKind.POD, "u1"), Resources(2000, GIB), reason="bound pod")

    for _ in range(FULL_PASS_EVERY):
        sync.step()

    assert slurm.updates == ["k8scpu:14,k8smemory:30976"]
