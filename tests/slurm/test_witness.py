"""The headroom's witness (app.slurm.witness, issue 30): an admission inside a node's grant
skips Slurm only while slurmctld is the one the grant was read from and answered lately.
A fake slurmrestd, a real ledger; tests/slurm/test_headroom_disruptions.py proves it on the
real clusters."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.admission.service import AdmissionRequest, Admissions
from app.core.caps import KubeCaps
from app.core.gres import gres_count
from app.core.headroom import HeadroomPolicy
from app.core.ledger_errors import AdmissionRejected
from app.core.records import EventKind, Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.core.slurm_models import SlurmNode
from app.db.engine import Database
from app.ledger.service import Ledger
from app.slurm.errors import SlurmUnavailable
from app.slurm.gate import SlurmGate
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from app.slurm.sync import SlurmSync
from app.slurm.witness import SlurmWitness
from tests.support.fake_slurm import UnchangedSlurm, slurm_node

GIB = 1024**3
POLICY = HeadroomPolicy(amount=Resources(2000, 4 * GIB), low_water=0, idle_seconds=3600)


class RestartingSlurm(UnchangedSlurm):
    """Also says when slurmctld started; ``on_read`` runs at each read of the node."""

    def __init__(self, node: SlurmNode) -> None:
        super().__init__(node)
        self.started = 1000
        self.on_read: list[object] = []

    def started_at(self) -> int:
        if self.down:
            raise SlurmUnavailable("slurmrestd GET diag/: unreachable")
        return self.started

    def get_node(self, name: str) -> SlurmNode:
        node = super().get_node(name)
        while self.on_read:
            callback = self.on_read.pop()
            assert callable(callback)
            callback()
        return node


@dataclass
class Service:
    ledger: Ledger
    slurm: RestartingSlurm
    witness: SlurmWitness
    sync: SlurmSync
    admissions: Admissions
    clock: list[float]

    def admit(self, uid: str, cpu_millis: int) -> bool:
        """Whether the admission skipped Slurm (held inside the grant)."""
        self.admissions.admit(
            AdmissionRequest("n1", Holder(HolderKind.POD, uid), Resources(cpu_millis, GIB))
        )
        events = self.ledger.events(kind=EventKind.ADMITTED, limit=1000)
        (event,) = [e for e in events if e.holder_id == uid]
        return bool(event.details.get("within_headroom"))

    def granted_cpus(self) -> int:
        return self.ledger.get_node("n1").headroom.granted.cpu_millis


@pytest.fixture
def service(database: Database) -> Service:
    ledger = Ledger(database, headroom=POLICY)
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    slurm = RestartingSlurm(slurm_node())
    clock = [0.0]
    witness = SlurmWitness(max_age=30, monotonic=lambda: clock[0])
    pusher = Pusher(slurm, ledger, witness=witness)  # type: ignore[arg-type]
    holds = HoldJobs(slurm)  # type: ignore[arg-type]
    sync = SlurmSync(slurm, ledger, pusher, holds=holds, monotonic=lambda: clock[0])  # type: ignore[arg-type]
    admissions = Admissions(ledger, SlurmGate(pusher, KubeCaps(), holds=holds))
    return Service(ledger, slurm, witness, sync, admissions, clock)


def test_no_admission_skips_slurm_before_the_first_read_of_slurmctld(service: Service) -> None:
    assert not service.admit("p1", 1000)  # through Slurm: 1 CPU + 2 withheld
    assert not service.admit("p2", 500)  # inside the grant, but nothing witnessed yet
    service.sync.step()  # a grant from before the first read is void
    assert service.granted_cpus() == 0
    assert not service.admit("p3", 500)
    assert service.admit("p4", 500)


def test_a_restart_voids_every_grant_until_a_read_back_confirms_it(service: Service) -> None:
    service.sync.step()
    assert not service.admit("p1", 1000)
    assert service.granted_cpus() == 3000
    assert service.admit("p2", 500)

    service.slurm.started += 60  # slurmctld restarted (its counts: whatever it had saved)
    service.sync.step()
    assert service.granted_cpus() == 0
    assert not service.admit("p3", 500)  # through Slurm, whose read-back grants again
    assert service.granted_cpus() == 4000  # 2 held + 2 of headroom
    assert service.admit("p4", 500)


def test_slurm_unreachable_closes_the_fast_path_at_once_and_voids_the_grants(
    service: Service,
) -> None:
    service.sync.step()
    assert not service.admit("p1", 1000)
    service.slurm.down = True
    with pytest.raises(AdmissionRejected, match="unreachable"):
        service.admit("p2", 4000)  # beyond the grant: its push finds slurmrestd away
    assert not service.witness.trusted()  # at once, before any sync step
    with pytest.raises(AdmissionRejected, match="unreachable"):
        service.admit("p3", 500)  # inside the grant, through Slurm: refused
    service.sync.step()
    assert service.granted_cpus() == 0  # for every replica, in the ledger

    service.slurm.down = False
    service.sync.step()  # trusted again; the node p2 left owed is pushed and read back
    assert service.witness.trusted()
    counted = gres_count(service.slurm.node.gres, "k8scpu")
    assert service.granted_cpus() == (16 - counted) * 1000  # what the read-back showed


def test_a_push_under_way_when_doubt_comes_raises_no_grant(service: Service) -> None:
    service.sync.step()
    service.slurm.on_read.append(lambda: service.witness.doubt("slurmctld restarted"))
    assert not service.admit("p1", 1000)  # doubt came while its push read the node back
    assert service.granted_cpus() == 0


def test_a_witness_not_read_for_max_age_closes_the_fast_path(service: Service) -> None:
    service.sync.step()
    assert not service.admit("p1", 1000)
    service.clock[0] += 31  # no sync step for 31 s (stuck, or slower than its interval)
    assert not service.admit("p2", 500)
    service.sync.step()
    assert service.admit("p3", 500)
