"""The Slurm state cache: other threads see only what its owner published, whole."""

from __future__ import annotations

import pytest

from app.core.resources import Resources
from app.core.slurm_models import JobAllocation, Listing, SlurmJob
from app.slurm.state import SlurmState
from tests.slurm.test_push_coalescing import slurm_node

MIB = 2**20


def job(job_id: str, node: str) -> SlurmJob:
    return SlurmJob(
        job_id, "wrap", "alice", frozenset({"RUNNING"}), (JobAllocation(node, 2, 1000, 0),)
    )


def test_readers_see_a_change_only_once_published_and_cannot_change_it() -> None:
    state = SlurmState()
    before = state.snapshot()
    state.apply_listings((Listing((slurm_node(),), 1), Listing((job("7", "n1"),), 1)), 0.0)
    assert state.snapshot() is before
    assert before.node_size("n1") is None
    assert before.jobs_on("n1") == []

    state.publish()
    published = state.snapshot()
    assert published.node_size("n1") == Resources(16000, 32000 * MIB)
    assert published.jobs_on("n1") == [job("7", "n1")]
    with pytest.raises(TypeError):
        published.nodes["n2"] = slurm_node(name="n2")  # type: ignore[index]

    state.put_hinted("7", None, 1.0)  # it ended
    assert state.snapshot().jobs_on("n1") == [job("7", "n1")]  # until published
    state.publish()
    assert state.snapshot().jobs_on("n1") == []
    assert published.jobs_on("n1") == [job("7", "n1")]  # an old snapshot never changes


def test_nothing_new_publishes_nothing() -> None:
    state = SlurmState()
    state.apply_listings((Listing((slurm_node(),), 1), None), 0.0)
    state.publish()
    published = state.snapshot()
    assert state.apply_listings((None, None), 1.0) is False  # both 304
    state.publish()
    assert state.snapshot() is published
