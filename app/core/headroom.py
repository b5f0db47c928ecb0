"""The Kubernetes headroom: what the ledger withholds from Slurm on a node beyond what is
held, ahead of demand, so that an admission that fits it needs no Slurm call. Pure.

Per node, in base units:
- held: what pods and manual reservations hold (what Slurm must withhold in any case);
- target: the headroom kept beyond held (zero while the node is idle);
- withheld = held + target: what the pusher makes Slurm withhold (app.core.counts);
- granted: what Slurm withheld with no job using it at the last read-back of the node
  (app.core.counts.slurm_grant).

Why an admission inside ``granted`` is safe without asking Slurm
(docs/design.md#the-headroom-and-why-it-stays-safe): it is decided under the node's row
lock, on ``held + request <= granted``; ``granted`` rises only at a push's read-back, under
the node's exclusive lock (app.db.locks); and before a push lowers what Slurm withholds it
lowers ``granted``, committed, under the row lock. So at every instant Slurm withholds at
least ``granted`` and no job uses any of it.

The target's life: the first admission on an idle node sets it to the node's amount and
takes the Slurm path, whose push withholds held + target; admissions that fit what is
granted are then confirmed at once, and one that leaves less free than the low-water mark
asks for a refill (a push off the admission path). An admission that does not fit takes the
Slurm path and grows the target by the grow step, up to its maximum, once a read-back showed
Slurm withholding the current target (so a burst that outran a push grows it once, not once
per admission). After ``idle_seconds`` without an admission, or at the sync step that sees a
Slurm job waiting for resources (or refused at submit) in the node's partitions, the target
goes back to zero and Slurm gets the headroom back (the next admission there sets it again:
pods came back). A release on a node with a target adds what it frees to the target, up to
the maximum: a burst that leaves and comes back (a Job's next wave) costs Slurm no push.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from app.core.nodestate import NodeState
from app.core.quantities import QuantityError, Rounding, cpu_millis, memory_bytes
from app.core.records import NodeHeadroom
from app.core.resources import Resources
from app.core.verdict import Cap

CPU_LABEL = "nodeledger.io/headroom-cpu"
MEMORY_LABEL = "nodeledger.io/headroom-memory"
GPU_LABEL = "nodeledger.io/headroom-gpu"


class HeadroomNode(NodeState, Protocol):
    """What the headroom's decisions read of a node (NodeView and NodeTotals both are)."""

    @property
    def headroom(self) -> NodeHeadroom: ...

    @property
    def held_manually(self) -> Resources: ...


@dataclass(frozen=True, slots=True)
class HeadroomPolicy:
    """The settings (NODELEDGER_SLURM_HEADROOM_*): ``amount`` per node unless its labels
    say otherwise; refill below ``low_water`` (a fraction of the target) free; grow by
    ``grow_step`` times the amount, up to ``max_factor`` times it; give back after
    ``idle_seconds``. ``caps``: Kubernetes' share of a node, which the ledger's admission
    decision applies (app.core.decision) so that an admission confirmed without the Slurm
    gate respects it as the gate does."""

    amount: Resources = Resources.ZERO
    low_water: float = 0.5
    grow_step: float = 1.0
    max_factor: float = 4.0
    idle_seconds: float = 300.0
    caps: Cap | None = None

    def amount_for(self, labels: Mapping[str, str]) -> Resources:
        """The node's amount: its labels' where set, else the default. An unparsable label
        gives no headroom for that resource (no admission skips Slurm on a typo)."""
        return Resources(
            _label(labels, CPU_LABEL, self.amount.cpu_millis, cpu_millis),
            _label(labels, MEMORY_LABEL, self.amount.memory_bytes, memory_bytes),
            _label(labels, GPU_LABEL, self.amount.gpus, _whole),
        )

    def maximum(self, amount: Resources) -> Resources:
        return _scaled(amount, self.max_factor)


NO_POLICY = HeadroomPolicy()


@dataclass(frozen=True, slots=True)
class AdmitStep:
    """How an admission the ledger found fitting proceeds: ``fast``, confirmed at once
    (inside what Slurm withholds); else through the Slurm gate. ``target``: the node's
    target after it. ``refill``: a fast one left the headroom below its low-water mark."""

    fast: bool
    target: Resources
    refill: bool = False


def admit_step(
    node: HeadroomNode,
    request: Resources,
    policy: HeadroomPolicy,
    within_cap: Callable[[], bool] = lambda: True,
) -> AdmitStep | None:
    """The step for ``request`` on ``node``, which the admission decision's verdict
    admitted (app.core.decision); None when the node has no headroom (every admission there
    goes through the gate, as without). ``within_cap``: whether the verdict's Kubernetes
    cap check passes (over it, the gate refuses the hold with that check's reason); asked
    only of a request inside the grant."""
    headroom = node.headroom
    amount = policy.amount_for(node.spec.labels)
    if amount.is_zero():
        return None
    after = held(node) + request
    if after.fits_within(headroom.granted) and within_cap():
        return AdmitStep(True, headroom.target, _low(headroom.granted - after, headroom, policy))
    if headroom.target.is_zero():
        return AdmitStep(False, amount)  # the first admission after idle: push the headroom
    if not headroom.target.fits_within(headroom.granted):
        # No read-back has shown Slurm withholding this target yet (its push is under way):
        # a burst that outran it grows it once, not once per admission.
        return AdmitStep(False, headroom.target)
    grown = headroom.target + _scaled(amount, policy.grow_step)
    return AdmitStep(False, grown.at_most(policy.maximum(amount)))


def settled_target(
    labels: Mapping[str, str],
    headroom: NodeHeadroom,
    policy: HeadroomPolicy,
    now: datetime,
    *,
    contended: bool = False,
) -> Resources:
    """The target once idle time, Slurm's demand and the policy are applied: zero after
    ``idle_seconds`` without an admission, zero while ``contended`` (Slurm jobs that may run
    on the node wait for resources: the headroom would starve them), and never above the
    node's maximum (a label lowered)."""
    if headroom.target.is_zero():
        return headroom.target
    if contended:
        return Resources.ZERO
    used = headroom.used_at
    if used is None or (now - used).total_seconds() >= policy.idle_seconds:
        return Resources.ZERO
    return headroom.target.at_most(policy.maximum(policy.amount_for(labels)))


def released_target(
    labels: Mapping[str, str], headroom: NodeHeadroom, released: Resources, policy: HeadroomPolicy
) -> Resources:
    """The target once ``released`` left the node: while the node has a target, what the
    release frees stays withheld as headroom, up to the node's maximum, so that the
    release needs no push (Slurm keeps withholding what it did, never less than needed).
    An idle node's release gives back at once."""
    if headroom.target.is_zero():
        return headroom.target
    return (headroom.target + released).at_most(policy.maximum(policy.amount_for(labels)))


def held(node: HeadroomNode) -> Resources:
    """What the counts must make Slurm withhold on the node whatever the headroom: pods and
    reservations, GPU device holdings included: their hold jobs ask for no k8s
    GRES, so that a hold that ends (a scancel, a time limit, a node set DOWN) exposes none
    of the pod's CPUs, memory or GPU count to Slurm's jobs."""
    return node.held_by_kubernetes + node.held_manually


def free(node: HeadroomNode) -> Resources:
    """What is granted beyond what is held (negative: held beyond the grant)."""
    return node.headroom.granted - held(node)


def _low(left: Resources, headroom: NodeHeadroom, policy: HeadroomPolicy) -> bool:
    mark = _scaled(headroom.target, policy.low_water)
    return (
        left.cpu_millis < mark.cpu_millis
        or left.memory_bytes < mark.memory_bytes
        or left.gpus < mark.gpus
    )


def _scaled(amount: Resources, factor: float) -> Resources:
    return Resources(
        int(amount.cpu_millis * factor),
        int(amount.memory_bytes * factor),
        int(amount.gpus * factor),
    )


def _whole(text: str, _: Rounding) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _label(
    labels: Mapping[str, str], key: str, default: int, parse: Callable[[str, Rounding], int]
) -> int:
    text = labels.get(key)
    if text is None:
        return default
    try:
        return max(0, parse(text, Rounding.DOWN))
    except (QuantityError, ValueError):
        return 0
