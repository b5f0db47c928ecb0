"""An update whose answer was lost may land after a newer push (issue 30): the node stays
owed, so the sync reads it back and pushes again, even while the listings say nothing
changed (304, as with job hints between full passes). A fake slurmrestd that keeps a lost
update and applies it when the test says; a real SQLite ledger.

The test marked slurm proves on the real cluster what makes a late update possible:
slurmrestd applies a node update the client gave up on, once it runs again."""

from __future__ import annotations

import pytest

from app.core.records import Holder, HolderKind, NodeSpec
from app.core.resources import Resources
from app.ledger.service import Ledger
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmAnswerLost
from app.slurm.holds import HoldJobs
from app.slurm.push import Pusher
from app.slurm.sync import SlurmSync
from app.slurm.tokens import FileToken
from tests.slurm.helpers import gres
from tests.support.fake_slurm import NodeUpdate, UnchangedSlurm, slurm_node
from tests.support.realenv import wait_until
from tests.support.slurm_cluster import SlurmCluster

GIB = 1024**3


class LosingSlurm(UnchangedSlurm):
    """Loses the answer of the next update after ``lose_next()``: slurmrestd still has it,
    and applies it at ``land_late()``."""

    def __init__(self) -> None:
        super().__init__(slurm_node())
        self._lose = False
        self._late: list[NodeUpdate] = []

    def lose_next(self) -> None:
        self._lose = True

    def before_update(self, name: str, update: NodeUpdate) -> None:
        if self._lose:
            self._lose = False
            self._late.append(update)
            raise SlurmAnswerLost(f"slurmrestd POST node/{name} timed out")
        super().before_update(name, update)

    def land_late(self) -> None:
        for late in self._late:
            super().update_node("n1", gres=late.gres, extra=late.extra)
        self._late.clear()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_late_update_is_undone_by_the_next_sync_step(ledger: Ledger) -> None:
    ledger.upsert_node("n1", NodeSpec(capacity=Resources(16000, 32000 * 2**20)))
    slurm = LosingSlurm()
    clock = Clock()
    pusher = Pusher(slurm, ledger)  # type: ignore[arg-type]
    pusher._now = clock
    sync = SlurmSync(slurm, ledger, pusher, holds=HoldJobs(slurm))  # type: ignore[arg-type]
    sync.step()  # the first, full pass
    pod = Holder(HolderKind.POD, "u1")
    ledger.admit("n1", pod, Resources(2000, GIB))
    pusher.push("n1")
    assert slurm.node.gres == "k8scpu:14,k8smemory:30976"

    # 1. The pod goes; the update giving its CPUs back to Slurm loses its answer.
    ledger.release("u1", HolderKind.POD)
    slurm.lose_next()
    with pytest.raises(SlurmAnswerLost):
        pusher.push("n1", reason="released")
    assert pusher.owed() == ["n1"]
    # 2. Another pod is admitted: its push reads back the right counts.
    ledger.admit("n1", Holder(HolderKind.POD, "u2"), Resources(4000, GIB))
    assert pusher.push("n1").node.gres == "k8scpu:12,k8smemory:30976"
    # 3. Then the lost update lands: Slurm would give u2's CPUs to jobs.
    slurm.land_late()
    assert slurm.node.gres == "k8scpu:16,k8smemory:32000"
    assert pusher.owed() == ["n1"], "a push after a lost answer cleared the node"

    sync.step()  # listings unchanged (304): the owed node alone is read back and pushed
    assert slurm.node.gres == "k8scpu:12,k8smemory:30976"
    assert pusher.owed() == ["n1"]  # still within the window

    clock.now += Pusher.late_window
    sync.step()  # past the window: nothing late can come any more
    assert pusher.owed() == []
    assert slurm.node.gres == "k8scpu:12,k8smemory:30976"


@pytest.mark.slurm
def test_an_update_whose_answer_was_lost_lands_later(slurm: SlurmCluster) -> None:
    client = SlurmClient(slurm.url, FileToken(slurm.token_file), timeout=1.0, retries=3)
    assert client.version  # negotiated while slurmrestd answers
    assert gres(slurm, "n1")["k8scpu"] == 16
    slurm.pause_restd()  # accepts connections, answers nothing
    try:
        with pytest.raises(SlurmAnswerLost):
            client.update_node("n1", gres="k8scpu:3,k8smemory:32000")
        assert gres(slurm, "n1")["k8scpu"] == 16  # slurmctld has not seen it yet
    finally:
        slurm.resume_restd()
    # The client gave up (and, the answer being lost, did not retry), yet it lands.
    wait_until(lambda: gres(slurm, "n1")["k8scpu"] == 3, timeout=60, what="the late update")
