"""One maintenance on both sides of a co-managed node. Pure.

Kubernetes to Slurm: a cordoned Node (``spec.unschedulable``, as ``kubectl cordon`` and
``kubectl drain`` set it) drains its Slurm node with a reason of the service's own
(``CORDONED``); an uncordon resumes it only while that drain is still the service's alone
(``resume_refusal``), so an administrator's drain, one with another reason, or a node Slurm
itself set DOWN, NOT_RESPONDING or FAIL meanwhile is never undone.

Slurm to Kubernetes: when Slurm drains, downs or fails a co-managed node, the ledger
already admits nothing there, but other schedulers (DaemonSets, the default scheduler,
Kueue, the autoscaler's view) read only the Node. So the Node gets a taint of the
service's own key while Slurm keeps the node out, and loses it, and only it, when Slurm
returns the node:

    nodeledger.io/slurm-unavailable=DRAIN:NoSchedule
    annotation nodeledger.io/slurm-reason: "Slurm node n1 is DRAIN+IDLE: hw"

The taint's value is the unavailable states (label-value characters only); Slurm's own
words go in the annotation. Effect NoSchedule, so running pods stay (a Slurm health check
can be wrong); with ``evict`` a DOWN or FAIL node gets NoExecute instead.

Only a node that Slurm itself keeps out is tainted: a node Slurm does not list (not
co-managed, or mapped wrong) or one whose GPU hold job is gone (the service's own, for
seconds) is not a maintenance, nor is the service's own drain for a cordon (the Node is
cordoned already). So no loop can form: a cordon makes a drain that makes no taint, and a
Slurm drain makes a taint, never a cordon.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from app.core.plan import UNHEALTHY_STATES, slurm_reason, slurm_states

TAINT_KEY = "nodeledger.io/slurm-unavailable"
REASON_ANNOTATION = "nodeledger.io/slurm-reason"
EVICTING_STATES = frozenset({"DOWN", "FAIL"})
CORDONED = "nodeledger: cordoned in Kubernetes"  # how the service's drains begin


class SlurmAction(StrEnum):
    DRAIN = "drain"
    RESUME = "resume"


def slurm_action(cordoned: bool, health_reason: str | None) -> SlurmAction | None:
    """What the Slurm node needs for its Node's cordon: a drain when cordoned and not
    drained (by anyone), a resume when uncordoned and drained by the service alone."""
    states = slurm_states(health_reason)
    if cordoned and "DRAIN" not in states:
        return SlurmAction.DRAIN
    if not cordoned and resume_refusal(states, slurm_reason(health_reason)) is None:
        return SlurmAction.RESUME
    return None


def cordon_reason(at: datetime) -> str:
    """The reason of the service's drain (what ``resume_refusal`` recognises)."""
    return f"{CORDONED} at {at:%Y-%m-%dT%H:%M:%SZ}"


_CORDON_REASON = re.compile(re.escape(CORDONED) + r" at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def resume_refusal(states: Collection[str], reason: str) -> str | None:
    """Why a RESUME of a Slurm node in ``states`` with ``reason`` would undo a state the
    service did not set; None when the node is drained by the service's cordon alone.
    RESUME clears DOWN, FAIL and the drain at once, and Slurm appends its own words to a
    reason (": Not responding" when slurmd went away under the drain), so the reason must
    be exactly ours and DRAIN the only state that keeps the node out."""
    if "DRAIN" not in states:
        return "it is not drained"
    if others := sorted(set(states) & UNHEALTHY_STATES - {"DRAIN"}):
        return f"Slurm set it {'+'.join(others)} too"
    if _CORDON_REASON.fullmatch(reason) is None:
        return f"the drain's reason is not the service's alone: {reason!r}"
    return None


@dataclass(frozen=True, slots=True)
class SlurmTaint:
    value: str  # the unavailable states, e.g. "DRAIN" or "DOWN-DRAIN"
    effect: str  # NoSchedule, or NoExecute (``evict`` and DOWN/FAIL)
    reason: str  # Slurm's words, for the annotation

    def as_taint(self) -> dict[str, str]:
        return {"key": TAINT_KEY, "value": self.value, "effect": self.effect}


def slurm_taint(health_reason: str | None, *, evict: bool = False) -> SlurmTaint | None:
    """The taint a node with this ledger health reason should carry, or None."""
    states = slurm_states(health_reason)
    if not states or health_reason is None:
        return None
    if resume_refusal(states, slurm_reason(health_reason)) is None:
        return None  # the service's own drain alone: its Node is cordoned already
    effect = "NoExecute" if evict and states & EVICTING_STATES else "NoSchedule"
    return SlurmTaint("-".join(sorted(states)), effect, health_reason)


@dataclass(frozen=True, slots=True)
class NodePatch:
    """A JSON merge patch of a Node: its whole taint list and our annotation."""

    taints: list[dict[str, Any]]
    reason: str | None  # None: remove the annotation

    def body(self, resource_version: str) -> dict[str, Any]:
        # The resourceVersion makes it conditional: a Node changed meanwhile (another
        # taint added) answers 409 and is read again, so no one's taint is lost.
        meta = {
            "resourceVersion": resource_version,
            "annotations": {REASON_ANNOTATION: self.reason},
        }
        return {"metadata": meta, "spec": {"taints": self.taints}}


def node_patch(node: Mapping[str, Any], wanted: SlurmTaint | None) -> NodePatch | None:
    """What to change on ``node`` (a Node object) so that it carries ``wanted`` as the
    service's taint, others' taints kept in their order; None when it already does."""
    taints: Sequence[dict[str, Any]] = (node.get("spec") or {}).get("taints") or ()
    annotations: Mapping[str, str] = (node.get("metadata") or {}).get("annotations") or {}
    others = [t for t in taints if t.get("key") != TAINT_KEY]
    ours = [t for t in taints if t.get("key") == TAINT_KEY]
    want = [wanted.as_taint()] if wanted is not None else []
    reason = wanted.reason if wanted is not None else None
    if [_plain(t) for t in ours] == want and annotations.get(REASON_ANNOTATION) == reason:
        return None
    return NodePatch(others + want, reason)


def carried(node: Mapping[str, Any]) -> SlurmTaint | None:
    """The service's taint a Node carries (what a resync compares), or None."""
    for taint in (node.get("spec") or {}).get("taints") or ():
        if taint.get("key") == TAINT_KEY:
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            reason = str(annotations.get(REASON_ANNOTATION) or "")
            return SlurmTaint(str(taint.get("value", "")), str(taint.get("effect", "")), reason)
    return None


def _plain(taint: Mapping[str, Any]) -> dict[str, str]:
    """A taint as compared: key, value, effect (the API server adds timeAdded to NoExecute)."""
    return {k: str(taint.get(k, "")) for k in ("key", "value", "effect")}
