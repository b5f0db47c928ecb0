"""What makes a late update possible (issue 30), on the real cluster: slurmrestd applies a
node update the client gave up on, once it runs again. What the pusher does about it is
in test_late_updates.py."""

from __future__ import annotations

import pytest

from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmAnswerLost
from app.slurm.tokens import FileToken
from tests.slurm.helpers import gres
from tests.support.realenv import wait_until
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm


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
