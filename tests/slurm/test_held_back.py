"""Which jobs slurmctld held back for lowered k8s totals the leader nudges, and when
(app.slurm.held_back): the rules, with a recording client. On the real clusters:
tests/slurm/test_queued_jobs.py and tests/gpu/test_lost_hold.py."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.slurm_models import SlurmNode
from app.slurm.errors import SlurmErrorDetail, SlurmRequestError, SlurmUnavailable
from app.slurm.held_back import HeldBackJobs
from app.slurm.payloads import parse_job


def node(name: str, gres: str) -> SlurmNode:
    return SlurmNode(name, 16, 32000, 0, 0, 0, gres, "", frozenset({"IDLE"}), "", "")


class Recorder:
    def __init__(self) -> None:
        self.updated: list[str] = []
        self.fail: Exception | None = None

    def update_job(self, job_id: str, update: dict[str, Any]) -> None:
        assert update == {}  # nothing of the user's job changes
        if self.fail is not None:
            raise self.fail
        self.updated.append(job_id)


def nudger() -> tuple[HeldBackJobs, Recorder]:
    client = Recorder()
    return HeldBackJobs(client), client  # type: ignore[arg-type]


LOW = [node("n1", "k8scpu:2,k8smemory:32000"), node("n2", "k8smemory:32000")]
ROSE = [node("n1", "k8scpu:16,k8smemory:32000"), node("n2", "k8smemory:32000")]


def test_a_held_back_job_is_updated_once_when_first_seen_and_once_per_rise() -> None:
    held, client = nudger()
    assert held.nudge(LOW, ["7"]) == []
    assert client.updated == ["7"]  # first seen: a rise may have come before the listing
    held.nudge(LOW, ["7"])
    assert client.updated == ["7"]  # no rise: not again
    held.nudge(ROSE, ["7", "8"])
    assert client.updated == ["7", "7", "8"]
    held.nudge(ROSE, ["7", "8"])
    held.nudge(LOW, ["7", "8"])  # a fall is no reason
    assert client.updated == ["7", "7", "8"]


@pytest.mark.parametrize(
    "after",
    [
        [node("n1", "k8scpu:2,k8smemory:32000"), node("n2", "k8scpu:1,k8smemory:32000")],
        [node("n1", "k8scpu:2,k8smemory:32001"), node("n2", "k8smemory:32000")],
        [node("n1", "k8scpu:2,k8smemory:32000,k8sgpu:1"), node("n2", "k8smemory:32000")],
        [*LOW, node("n3", "k8scpu:16,k8smemory:32000")],
    ],
    ids=["cpu", "memory", "gpu", "new-node"],
)
def test_every_total_that_rises_counts(after: list[SlurmNode]) -> None:
    held, client = nudger()
    held.nudge(LOW, ["7"])
    held.nudge(after, ["7"])
    assert client.updated == ["7", "7"]


def test_no_held_back_job_forgets_the_totals() -> None:
    held, client = nudger()
    held.nudge(ROSE, ["7"])
    held.nudge(ROSE, [])
    held.nudge(ROSE, ["7"])  # held back again: a new episode, evaluated once more
    assert client.updated == ["7", "7"]


GONE = SlurmRequestError(
    "slurmrestd POST job/7", errors=(SlurmErrorDetail(2017, "Invalid job id specified"),)
)
DENIED = SlurmRequestError(
    "slurmrestd POST job/7", errors=(SlurmErrorDetail(2002, "Access/permission denied"),)
)


def test_a_job_gone_meanwhile_is_no_failure_a_refusal_or_outage_is_tried_again() -> None:
    held, client = nudger()
    client.fail = GONE
    assert held.nudge(LOW, ["7"]) == []
    client.fail = DENIED  # e.g. a token whose user may not update others' jobs
    [refused] = held.nudge(ROSE, ["7"])
    assert "Access/permission denied" in refused
    client.fail = SlurmUnavailable("slurmrestd: connection refused")
    assert held.nudge(ROSE, ["7"]) == ["job 7: slurmrestd: connection refused"]
    client.fail = None
    assert held.nudge(ROSE, ["7"]) == []
    assert client.updated == ["7"]


@pytest.mark.parametrize(
    ("reason", "tres", "state", "held_back"),
    [
        ("BadConstraints", "gres/k8scpu:2,gres/k8smemory:200", "PENDING", True),
        ("BadConstraints", "gres:k8sgpu:1", "PENDING", True),
        ("BadConstraints", "gres/gpu:1", "PENDING", False),  # asks for no k8s GRES
        ("BadConstraints", "gres/k8scpux:1", "PENDING", False),
        ("Resources", "gres/k8scpu:2", "PENDING", False),
        ("None", "gres/k8scpu:2", "RUNNING", False),
    ],
)
def test_held_back_is_read_from_the_job(
    reason: str, tres: str, state: str, held_back: bool
) -> None:
    raw = {"job_id": 7, "job_state": [state], "state_reason": reason, "tres_per_node": tres}
    assert parse_job(raw).held_back is held_back


@pytest.mark.parametrize(
    ("state", "reason", "tres", "comment", "waits"),
    [
        ("PENDING", "Resources", "gres/k8scpu:2", "", True),
        ("PENDING", "BadConstraints", "gres/k8smemory:200", "", True),
        ("FAILED", "BadConstraints", "gres/k8scpu:8", "", True),  # refused at submit
        ("PENDING", "Constraints", "gres/k8scpu:8", "", True),  # queued behind pods
        ("FAILED", "NonZeroExitCode", "gres/k8scpu:8", "", False),  # it ran
        ("PENDING", "Priority", "gres/k8scpu:2", "", False),  # behind one naming the partition
        ("PENDING", "Dependency", "gres/k8scpu:2", "", False),
        ("PENDING", "Resources", "gres/gpu:1", "", False),  # asks for no k8s GRES
        # Named as a hold and asking k8s GRES: a user's job (a hold job is given none).
        ("PENDING", "Resources", "gres/k8scpu:2", "nodeledger-hold:pod-uid", True),
        ("FAILED", "BadConstraints", "gres/gpu:g0:1", "nodeledger-hold:pod-uid", False),  # 2016
    ],
)
def test_a_job_waits_for_resources_when_it_pends_for_them_or_was_refused_asking_k8s_gres(
    state: str, reason: str, tres: str, comment: str, waits: bool
) -> None:
    raw = {
        "job_id": 7,
        "name": "nodeledger-hold" if comment else "wrap",
        "job_state": [state],
        "state_reason": reason,
        "tres_per_node": tres,
        "comment": comment,
        "partition": "debug,gpu",
    }
    job = parse_job(raw)
    assert job.waits_for_resources is waits
    assert job.partitions == {"debug", "gpu"}
