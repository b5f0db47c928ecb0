"""One maintenance on both sides (app.core.maintenance), table-tested: Slurm's states as the
Node's taint, a cordon as a Slurm drain; when the two sides disagree (app.core.disagreement)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.core.disagreement import Disagreements, disagree
from app.core.maintenance import (
    REASON_ANNOTATION,
    TAINT_KEY,
    SlurmAction,
    SlurmTaint,
    carried,
    cordon_reason,
    node_patch,
    resume_refusal,
    slurm_action,
    slurm_taint,
)
from app.core.plan import health_reason, slurm_lists, slurm_states
from app.core.slurm_models import SlurmNode


def slurm_node(states: str, reason: str = "") -> SlurmNode:
    return SlurmNode("n1", 16, 32000, 0, 0, 0, "", "", frozenset(states.split("+")), reason, "")


@pytest.mark.parametrize(
    ("states", "reason", "expected"),
    [
        ("IDLE", "", frozenset()),
        ("IDLE+DRAIN", "hw: PSU", frozenset({"DRAIN"})),
        ("DOWN+DRAIN+NOT_RESPONDING", "", frozenset({"DOWN", "DRAIN", "NOT_RESPONDING"})),
        ("MIXED+FAIL", "Slurm node n1 is DOWN: a reason that looks like ours", frozenset({"FAIL"})),
    ],
)
def test_the_states_read_back_from_the_health_reason(
    states: str, reason: str, expected: frozenset[str]
) -> None:
    assert slurm_states(health_reason(slurm_node(states, reason), "n1")) == expected


def test_reasons_that_are_no_slurm_state_give_none() -> None:
    assert slurm_states(health_reason(None, "n1")) == frozenset()  # no such node in Slurm
    assert slurm_states("Slurm hold jobs of GPU devices gone, held again soon: p") == frozenset()
    assert slurm_states(None) == frozenset()


DRAINED = "Slurm node n1 is DRAIN+IDLE: hw"
DOWNED = "Slurm node n1 is DOWN+DRAIN"


@pytest.mark.parametrize(
    ("reason", "evict", "expected"),
    [
        (None, False, None),
        (DRAINED, False, SlurmTaint("DRAIN", "NoSchedule", DRAINED)),
        (DOWNED, False, SlurmTaint("DOWN-DRAIN", "NoSchedule", DOWNED)),
        (DOWNED, True, SlurmTaint("DOWN-DRAIN", "NoExecute", DOWNED)),
        (DRAINED, True, SlurmTaint("DRAIN", "NoSchedule", DRAINED)),
        ("Slurm has no node 'n1'", True, None),
    ],
)
def test_the_taint_follows_slurms_states(
    reason: str | None, evict: bool, expected: SlurmTaint | None
) -> None:
    assert slurm_taint(reason, evict=evict) == expected


OTHERS = {"key": "example.com/gpu-broken", "effect": "NoSchedule"}
DRAIN = SlurmTaint("DRAIN", "NoSchedule", DRAINED)


def node(*taints: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    annotations = {REASON_ANNOTATION: reason} if reason is not None else {}
    return {"metadata": {"annotations": annotations}, "spec": {"taints": list(taints)}}


def test_a_drain_adds_our_taint_after_everyone_elses() -> None:
    patch = node_patch(node(OTHERS), DRAIN)
    assert patch is not None
    assert patch.taints == [OTHERS, {"key": TAINT_KEY, "value": "DRAIN", "effect": "NoSchedule"}]
    assert patch.body("42") == {
        "metadata": {"resourceVersion": "42", "annotations": {REASON_ANNOTATION: DRAIN.reason}},
        "spec": {"taints": patch.taints},
    }


def test_a_resume_removes_only_our_taint_and_annotation() -> None:
    ours = {"key": TAINT_KEY, "value": "DRAIN", "effect": "NoSchedule"}
    patch = node_patch(node(ours, OTHERS, reason=DRAIN.reason), None)
    assert patch is not None
    assert patch.taints == [OTHERS]
    assert patch.body("7")["metadata"]["annotations"] == {REASON_ANNOTATION: None}


def test_a_node_that_carries_what_is_wanted_is_left_alone() -> None:
    ours = {"key": TAINT_KEY, "value": "DRAIN", "effect": "NoSchedule", "timeAdded": "x"}
    tainted = node(OTHERS, ours, reason=DRAIN.reason)
    assert node_patch(tainted, DRAIN) is None
    assert carried(tainted) == DRAIN
    assert node_patch(node(OTHERS), None) is None
    assert carried(node(OTHERS)) is None


def test_a_changed_state_or_reason_is_written_again() -> None:
    ours = {"key": TAINT_KEY, "value": "DRAIN", "effect": "NoSchedule"}
    down = SlurmTaint("DOWN-DRAIN", "NoSchedule", "Slurm node n1 is DOWN+DRAIN: hw")
    assert node_patch(node(ours, reason=DRAIN.reason), down) is not None
    other_reason = SlurmTaint("DRAIN", "NoSchedule", "Slurm node n1 is DRAIN+IDLE: fan")
    assert node_patch(node(ours, reason=DRAIN.reason), other_reason) is not None


OURS = "Slurm node n1 is DRAIN+IDLE: nodeledger: cordoned in Kubernetes at 2026-11-27T01:40:00Z"


@pytest.mark.parametrize(
    ("cordoned", "reason", "expected"),
    [
        (True, None, SlurmAction.DRAIN),
        (True, "Slurm node n1 is DOWN+IDLE", SlurmAction.DRAIN),  # so it stays out after
        (True, DRAINED, None),  # drained already, by an administrator: left as it is
        (True, OURS, None),
        (False, OURS, SlurmAction.RESUME),
        (False, DRAINED, None),  # an administrator's drain is never undone
        (False, "Slurm node n1 is DRAIN+IDLE: hw; nodeledger: cordoned in Kubernetes", None),
        (False, None, None),
        # slurmd went away under our drain: Slurm's DOWN and its words are not ours to undo.
        (False, OURS.replace("DRAIN+IDLE", "DOWN+DRAIN+NOT_RESPONDING"), None),
        (False, f"{OURS}: Not responding", None),
        (False, OURS.replace("DRAIN+IDLE", "DRAIN+FAIL+IDLE"), None),
        (False, OURS.replace("DRAIN+IDLE", "ALLOCATED+DRAIN"), SlurmAction.RESUME),
    ],
)
def test_a_cordon_drains_slurm_and_an_uncordon_resumes_only_the_services_drain(
    cordoned: bool, reason: str | None, expected: SlurmAction | None
) -> None:
    assert slurm_action(cordoned, reason) == expected


CORDON = "nodeledger: cordoned in Kubernetes at 2026-11-27T01:40:00Z"


@pytest.mark.parametrize(
    ("states", "reason", "refusal"),
    [
        pytest.param("IDLE+DRAIN", CORDON, None, id="ours"),
        pytest.param("MIXED+DRAIN", CORDON, None, id="ours-with-jobs"),
        pytest.param("IDLE", CORDON, "it is not drained", id="resumed-already"),
        pytest.param("DOWN+DRAIN+NOT_RESPONDING", f"{CORDON}: Not responding",
                     "Slurm set it DOWN+NOT_RESPONDING too", id="slurmd-gone"),
        pytest.param("IDLE+DRAIN", f"{CORDON}: Not responding",
                     f"the drain's reason is not the service's alone: '{CORDON}: Not responding'",
                     id="slurm-appended"),
        pytest.param("IDLE+DRAIN", "hw", "the drain's reason is not the service's alone: 'hw'",
                     id="an-administrators"),
    ],
)  # fmt: skip
def test_a_resume_undoes_only_the_services_drain(
    states: str, reason: str, refusal: str | None
) -> None:
    assert resume_refusal(frozenset(states.split("+")), reason) == refusal


def test_the_services_own_drain_makes_no_taint() -> None:
    assert slurm_taint(OURS) is None  # the Node is cordoned already: no loop
    # slurmd died under it: Slurm's DOWN, which the uncordon leaves, keeps the Node tainted.
    gone = f"{OURS.replace('DRAIN+IDLE', 'DOWN+DRAIN+NOT_RESPONDING')}: Not responding"
    assert slurm_taint(gone) == SlurmTaint("DOWN-DRAIN-NOT_RESPONDING", "NoSchedule", gone)
    reason = cordon_reason(datetime(2026, 11, 27, 1, 40, tzinfo=UTC))
    assert reason == "nodeledger: cordoned in Kubernetes at 2026-11-27T01:40:00Z"
    assert slurm_action(False, f"Slurm node n1 is DRAIN+IDLE: {reason}") is SlurmAction.RESUME


TAINTED = SlurmTaint("DRAIN", "NoSchedule", DRAINED)


@pytest.mark.parametrize(
    ("cordoned", "taint", "reason", "expected"),
    [
        pytest.param(False, None, None, False, id="both-in"),
        pytest.param(False, TAINTED, DRAINED, False, id="drained-and-tainted"),
        pytest.param(True, None, OURS, False, id="cordoned-and-drained-for-it"),
        pytest.param(True, TAINTED, DOWNED, False, id="cordoned-tainted-and-down"),
        pytest.param(False, None, DRAINED, True, id="drained-not-tainted"),
        pytest.param(False, None, "Slurm node n1 is IDLE+NOT_RESPONDING", True,
                     id="not-responding"),
        pytest.param(True, None, None, True, id="cordoned-not-drained"),
        pytest.param(False, TAINTED, None, True, id="tainted-after-a-resume"),
        pytest.param(False, None, "Slurm hold jobs of GPU devices gone, held again soon: p", False,
                     id="no-slurm-state"),
    ],
)  # fmt: skip
def test_the_sides_disagree_when_exactly_one_keeps_the_node_out(
    cordoned: bool, taint: SlurmTaint | None, reason: str | None, expected: bool
) -> None:
    assert disagree(cordoned, taint, reason) is expected


def test_a_disagreement_is_as_old_as_the_first_look_that_found_it() -> None:
    seen = Disagreements()
    assert (seen.count(), seen.oldest(5.0)) == (0, 0.0)
    seen.look("n1", True, 10.0)
    seen.look("n2", True, 20.0)
    seen.look("n1", True, 30.0)  # still: its age counts from 10
    assert (seen.count(), seen.oldest(40.0)) == (2, 30.0)
    seen.look("n1", False, 41.0)
    assert (seen.count(), seen.oldest(41.0)) == (1, 21.0)
    seen.look("n1", True, 42.0)  # again: a new one
    seen.keep({"n1"})  # n2 no longer co-managed
    assert (seen.count(), seen.oldest(50.0)) == (1, 8.0)
    seen.clear()
    assert seen.count() == 0


def test_the_health_reason_says_whether_slurm_lists_the_node() -> None:
    assert not slurm_lists(health_reason(None, "n1"))
    assert slurm_lists(DRAINED)
    assert slurm_lists(None)
