"""Nodes registered from Slurm (NODELEDGER_SLURM_REGISTER_NODES): each Slurm node becomes a
ledger node sized as Slurm sees it, and one whose Slurm state makes it unusable is never
admissible, not even between its creation and the sync's look at its state. A fake
slurmrestd and a real database; against a real slurmctld of 1,003 nodes:
tests/slurm/test_sync_at_scale.py."""

from __future__ import annotations

from dataclasses import replace

from app.core.records import EventKind
from app.core.resources import Resources
from app.ledger.service import Ledger
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from app.slurm.sync import SlurmSync
from tests.support.fake_slurm import MIB, TwoNodeSlurm


def test_registered_nodes_are_sized_by_slurm_and_unusable_ones_never_admissible(
    ledger: Ledger,
) -> None:
    slurm = TwoNodeSlurm()
    down = frozenset({"DOWN", "NOT_RESPONDING"})
    slurm.nodes["n2"] = replace(slurm.nodes["n2"], states=down, reason="no slurmd")
    pusher = Pusher(slurm, ledger)  # type: ignore[arg-type]
    sync = SlurmSync(slurm, ledger, pusher, holds=HoldJobs(slurm), register_nodes=True)  # type: ignore[arg-type]

    sync.step()

    n1, n2 = ledger.get_node("n1"), ledger.get_node("n2")
    assert n1.spec.capacity == n2.spec.capacity == Resources(16000, 32000 * MIB)
    assert n1.admissible
    assert not n2.admissible
    assert n2.health_reason == "Slurm node n2 is DOWN+NOT_RESPONDING: no slurmd"
    # Created so: no moment in which it was admissible.
    assert [(e.kind, e.message) for e in ledger.events(node="n2")] == [
        (EventKind.NODE_CREATED, f"node created, not admissible: {n2.health_reason}")
    ]
    slurm.nodes["n2"] = replace(slurm.nodes["n2"], states=frozenset({"IDLE"}), reason="")
    sync.step()
    assert ledger.get_node("n2").admissible
