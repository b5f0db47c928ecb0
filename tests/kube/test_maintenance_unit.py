"""One maintenance on both sides (app.core.maintenance), table-tested: Slurm's states as the
Node's taint, a cordon as a Slurm drain."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.core.maintenance import (
    REASON_ANNOTATION,
    TAINT_KEY,
    SlurmAction,
    SlurmTaint,
    carried,
    cordon_reason,
    node_patch,
    slurm_action,
    slurm_taint,
)
from app.core.plan import health_reason, slurm_states
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
    ],
)
def test_a_cordon_drains_slurm_and_an_uncordon_resumes_only_the_services_drain(
    cordoned: bool, reason: str | None, expected: SlurmAction | None
) -> None:
    assert slurm_action(cordoned, reason) == expected


def test_the_services_own_drain_makes_no_taint() -> None:
    assert slurm_taint(OURS) is None  # the Node is cordoned already: no loop
    reason = cordon_reason(datetime(2026, 11, 27, 1, 40, tzinfo=UTC))
    assert reason == "nodeledger: cordoned in Kubernetes at 2026-11-27T01:40:00Z"
    assert slurm_action(False, f"Slurm node n1 is DRAIN+IDLE: {reason}") is SlurmAction.RESUME
