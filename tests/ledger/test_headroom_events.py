"""Every change of a node's headroom grant is an event naming the node, so that the read
model (app.ledger.snapshot), which reads a node again only on such events and skips
SLURM_PUSHED, shows what the database has: a refill push raising the grant, a push
lowering it before it tells Slurm less (a fake slurmrestd, a real ledger)."""

from __future__ import annotations

from app.admission.service import AdmissionRequest, Admissions
from app.core.caps import KubeCaps
from app.core.headroom import HeadroomPolicy
from app.core.records import EventKind, Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.db.engine import Database
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeSnapshot
from app.slurm.gate import SlurmGate
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from tests.support.fake_slurm import FakeSlurm, slurm_node

MIB = 2**20
CPU = Resources(1000)


def headroom_ledger(database: Database) -> Ledger:
    policy = HeadroomPolicy(amount=Resources(2000), caps=KubeCaps())
    ledger = Ledger(database, headroom=policy)
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * MIB)))
    return ledger


def test_a_refill_push_that_raises_the_grant_shows_in_the_snapshot(database: Database) -> None:
    ledger = headroom_ledger(database)
    pusher = Pusher(FakeSlurm(slurm_node(), latency=0), ledger)  # type: ignore[arg-type]
    snapshot = NodeSnapshot(ledger)

    def defer_push(node: str, reason: str, *, settle: float = 0.0) -> None:
        # The deferred pushes' thread runs later: the snapshot may refresh before it pushes.
        snapshot.views()
        pusher.push(node, reason=reason)

    admissions = Admissions(
        ledger, SlurmGate(pusher, KubeCaps(), holds=HoldJobs(pusher.client), defer_push=defer_push)
    )
    for i in range(3):  # through Slurm (held 1 + target 2), then twice inside the grant
        admissions.admit(AdmissionRequest("n1", Holder(HolderKind.POD, f"p{i}"), CPU))
    assert ledger.get_node("n1").headroom.granted == Resources(5000)  # refilled: 3 + 2
    assert snapshot.views()["n1"].headroom == ledger.get_node("n1").headroom
    kinds = [e.kind for e in ledger.events(node="n1")]
    # The push's own event first, then the grant's.
    assert kinds[-2:] == [EventKind.SLURM_PUSHED, EventKind.HEADROOM]


def test_a_grant_lowered_before_a_push_shows_in_the_snapshot(database: Database) -> None:
    ledger = headroom_ledger(database)
    snapshot = NodeSnapshot(ledger)
    with ledger.exclusive("n1") as node:
        node.finish(Resources(4000), None)  # a read-back with no event of its own
    assert snapshot.views()["n1"].headroom.granted == Resources(4000)
    with ledger.exclusive("n1") as node:
        lowered = node.view(grant_at_most=lambda _: Resources(1000))
        assert lowered.headroom.granted == Resources(1000)
        # Committed with its event before Slurm is told anything.
        assert snapshot.views()["n1"].headroom.granted == Resources(1000)
    last = ledger.events(node="n1")[-1]
    assert (last.kind, last.message) == (
        EventKind.HEADROOM,
        "headroom grant lowered to 1 cpu, 0 memory, 0 gpu",
    )
    with ledger.exclusive("n1") as node:
        node.view(grant_at_most=lambda _: Resources(1000))  # nothing to lower: no event
    assert ledger.events(node="n1")[-1] == last
