"""The admission verdict: may this request be held on this node now. Pure.

The node's part of the one admission decision (app.core.decision), which every caller
reads: the ledger's admit, the scheduler extender's filter, the Slurm gate and the
metrics' admissibility.

The checks, in this order (the first that fails is the verdict):
1. admissible: not cordoned, healthy in its integrations (Slurm), not overcommitted;
2. fits: the request is within free (capacity - reserved - every holding) for each
   resource;
3. within the Kubernetes cap (app.core.caps), when caps are given: what pods hold plus
   the request.

A node is any view of it (NodeView, NodeTotals) that carries its free amounts and its
not-admissible reason, both computed once per view by ``not_admissible_reason`` below:
the extender asks about a thousand nodes per call.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple, Protocol

from app.core.arithmetic import Shortfall, shortfalls
from app.core.nodestate import NodeState
from app.core.presentation import describe_shortfalls
from app.core.resources import Resources

OVERCOMMITTED = "overcommitted: holdings exceed capacity minus reserved"


def not_admissible_reason(cordon: str | None, health: str | None, free: Resources) -> str | None:
    """Why a node admits nothing new (check 1), or None: what views compute once."""
    reasons = [r for r in (cordon, health) if r]
    if not free.is_nonnegative():
        reasons.append(OVERCOMMITTED)
    return "; ".join(reasons) or None


class Cap(Protocol):
    """A limit on what one kind of holder may hold on a node (app.core.caps.KubeCaps).
    A protocol, so that this module needs no quantity parser (the caps parse labels)."""

    def violation(self, node: NodeState, adding: Resources = ...) -> str | None: ...


class Refusal(StrEnum):
    NOT_ADMISSIBLE = "not_admissible"
    INSUFFICIENT = "insufficient"
    OVER_KUBE_CAP = "over_kube_cap"


class Verdict(NamedTuple):
    """Admitted (``refusal`` None), or refused: ``reason`` says why in the extender's
    words, ``message`` in the ledger's (AdmissionRejected, REJECTED events), and
    ``shortfalls`` what is short when the request does not fit. A named tuple, as the
    decision is (app.core.decision): one per refused candidate of every filter."""

    refusal: Refusal | None = None
    reason: str = ""
    node: str = ""
    shortfalls: tuple[Shortfall, ...] = ()

    @property
    def admitted(self) -> bool:
        return self.refusal is None

    @property
    def message(self) -> str:
        if self.refusal is Refusal.NOT_ADMISSIBLE:
            return f"node {self.node!r} is not admissible: {self.reason}"
        return self.reason


ADMITTED = Verdict()  # one instance: the common case costs no allocation


def verdict(
    node: NodeState, request: Resources, caps: Cap | None = None, *, held: bool = False
) -> Verdict:
    """The verdict on holding ``request`` on ``node``.

    ``held``: the request is among the node's holdings already (a PENDING hold the Slurm
    gate confirms, on the node as its push reads it): admissibility and fit were decided
    when it was held, under the node's lock, so only the cap is checked, on figures that
    include it."""
    if not held:
        if (reason := node.not_admissible_reason) is not None:
            return Verdict(Refusal.NOT_ADMISSIBLE, reason, node.name)
        free = node.free
        if not request.fits_within(free):  # the extender asks a thousand nodes per call
            short = shortfalls(request, free)
            return Verdict(
                Refusal.INSUFFICIENT, describe_shortfalls(node.name, short), node.name, short
            )
    if caps is None:  # checked here: a call per node is a tenth of the extender's filter
        return ADMITTED
    return over_cap(node, request, caps, held=held) or ADMITTED


def over_cap(
    node: NodeState, request: Resources, caps: Cap | None, *, held: bool = False
) -> Verdict | None:
    """Check 3 alone: the refusal when Kubernetes would hold more than its cap with
    ``request`` (among the holdings already when ``held``), else None."""
    if caps is None:
        return None
    adding = Resources.ZERO if held else request
    if (violation := caps.violation(node, adding=adding)) is not None:
        return Verdict(Refusal.OVER_KUBE_CAP, violation, node.name)
    return None
