"""The Slurm state cache: other threads see only what its owner published, whole."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core.resources import Resources
from app.core.slurm_models import JobAllocation, Listing, SlurmJob
from app.slurm.state import SlurmState
from tests.support.fake_slurm import slurm_node

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


def waiting(job_id: str, *partitions: str) -> SlurmJob:
    return SlurmJob(
        job_id,
        "wrap",
        "alice",
        frozenset({"PENDING"}),
        (),
        state_reason="Resources",
        tres_per_node="gres/k8scpu:4",
        partitions=frozenset(partitions),
    )


def test_the_nodes_in_a_waiting_jobs_partitions_are_contended() -> None:
    nodes = (
        slurm_node(name="n1", partitions=frozenset({"debug"})),
        slurm_node(name="n2", partitions=frozenset({"debug", "gpu"})),
        slurm_node(name="n3", partitions=frozenset({"big"})),
    )
    state = SlurmState()
    state.apply_listings((Listing(nodes, 1), Listing((job("7", "n1"),), 1)), 0.0)
    assert state.contended() == set()
    state.apply_listings((None, Listing((waiting("8", "gpu"),), 2)), 0.0)
    assert state.contended() == {"n2"}
    state.apply_listings((None, Listing((waiting("8", "gpu"), waiting("9", "x", "big")), 3)), 0.0)
    assert state.contended() == {"n2", "n3"}
    state.apply_listings((None, Listing((waiting("9"),), 4)), 0.0)  # no partition listed
    assert state.contended() == {"n1", "n2", "n3"}
    state.apply_listings((None, Listing((), 5)), 0.0)
    assert state.contended() == set()


def test_a_refusal_counts_from_the_first_listing_on() -> None:
    """A refusal at submit stays listed for MinJobAge: one the first listing shows happened
    before this process and is not its to answer (nor a test's left by the one before)."""

    def refused(job_id: str) -> SlurmJob:
        return replace(
            waiting(job_id, "debug"), states=frozenset({"FAILED"}), state_reason="BadConstraints"
        )

    nodes = (slurm_node(name="n1", partitions=frozenset({"debug"})),)
    state = SlurmState()
    state.apply_listings((Listing(nodes, 1), Listing((refused("7"),), 1)), 0.0)
    assert state.contended() == set()
    state.apply_listings((None, Listing((refused("7"), refused("8")), 2)), 0.0)
    assert state.contended() == {"n1"}


@pytest.mark.parametrize(
    ("states", "extra", "on_marker"),
    [
        pytest.param({"PENDING"}, "nodeledger=1", True, id="pending-on-the-queue"),
        pytest.param({"PENDING"}, "site=a&nodeledger=1", True, id="in-a-users-expression"),
        pytest.param({"PENDING"}, "nodeledger=10", False, id="another-value"),
        pytest.param({"PENDING"}, "nodeledger_k8scpu<=16", False, id="another-key"),
        pytest.param({"PENDING"}, "", False, id="no-constraint"),
        pytest.param({"RUNNING"}, "nodeledger=1", False, id="started"),
    ],
)
def test_a_pending_job_on_the_queues_marker_is_seen(
    states: set[str], extra: str, on_marker: bool
) -> None:
    state = SlurmState()
    queued = replace(job("9", "n1"), states=frozenset(states), extra=extra)
    state.apply_listings((None, Listing((job("7", "n1"), queued), 1)), 0.0)
    assert state.jobs_on_marker() is on_marker
    state.apply_listings((None, None), 1.0)  # unchanged: as last listed
    assert state.jobs_on_marker() is on_marker
    state.apply_listings((None, Listing((job("7", "n1"),), 2)), 2.0)
    assert state.jobs_on_marker() is False
