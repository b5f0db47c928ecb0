"""The Slurm half of a cordon (app.slurm.drains) on the real clusters: an uncordon resumes
only a drain the service set alone. Slurm's own words appended to the reason (as slurmctld
does with ": Not responding" when slurmd goes away under the drain) and a DOWN set meanwhile
on a node whose slurmd is gone are left for Slurm or the administrator: a RESUME would
clear them too."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from app.core.maintenance import cordon_reason
from app.slurm.client import SlurmClient
from app.slurm.drains import SlurmDrains
from app.slurm.tokens import FileToken
from tests.support.realenv import wait_until
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm


@pytest.fixture
def drains(slurm: SlurmCluster) -> Iterator[SlurmDrains]:
    yield SlurmDrains(SlurmClient(slurm.url, FileToken(slurm.token_file)))
    slurm.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    wait_until(lambda: states(slurm) <= {"IDLE"}, 60, what="n2 back in service")


def states(slurm: SlurmCluster) -> set[str]:
    return set(slurm.node("n2")["state"])


@pytest.mark.parametrize("slurm_did", ["appended", "down"])
def test_an_uncordon_leaves_what_slurm_set_alone(
    drains: SlurmDrains, slurm: SlurmCluster, slurm_did: str
) -> None:
    ours = cordon_reason(datetime.now(UTC))
    assert drains.drain("n2", ours)
    if slurm_did == "appended":
        slurm.run("scontrol", "update", "nodename=n2", f"reason={ours}: Not responding")
        assert not drains.resume("n2")
        assert "DRAIN" in states(slurm)
        return
    # slurmd gone, so that no ping answer returns the node (ReturnToService=2); DOWN set
    # once slurmctld found it not responding: an answer sent before slurmd went, handled
    # late on a busy machine, would return the node.
    slurm.stop_slurmd("n2")
    try:
        wait_until(lambda: "NOT_RESPONDING" in states(slurm), 90, interval=1, what="n2 lost")
        slurm.run("scontrol", "update", "nodename=n2", "state=down", f"reason={ours}")
        assert {"DOWN", "DRAIN"} <= states(slurm)
        assert not drains.resume("n2")
        assert {"DOWN", "DRAIN"} <= states(slurm)
    finally:
        slurm.restart_slurmd("n2")


def test_an_uncordon_resumes_the_services_own_drain(
    drains: SlurmDrains, slurm: SlurmCluster
) -> None:
    assert drains.drain("n2", cordon_reason(datetime.now(UTC)))
    assert "DRAIN" in states(slurm)
    assert drains.resume("n2")
    assert "DRAIN" not in states(slurm)
