"""When the two sides of a co-managed node disagree ("one node, one
maintenance"), and since when. Pure.

The Kubernetes side keeps the node out when its Node is cordoned (``spec.unschedulable``)
or carries the service's taint (app.core.maintenance.TAINT_KEY); the Slurm side when the
ledger's health reason names a state that keeps it out (app.core.plan.slurm_states: DRAIN,
DOWN, FAIL, NOT_RESPONDING, INVALID_REG: what the taint follows). The sides disagree when
exactly one of them keeps the node out. A node Slurm does not list is not co-managed, and
never disagrees.

With both directions on and both APIs answering, the maintenance reconciler closes a
disagreement within a pass or two. One that lasts is one it will not or cannot close: its
direction turned off by a setting (``slurm_taints``, ``cordon_drains_slurm``), or a drain,
resume, taint or untaint pending because an API does not answer, or refuses the call.
"""

from __future__ import annotations

from collections.abc import Collection

from app.core.maintenance import SlurmTaint
from app.core.plan import slurm_states


def kube_unavailable(cordoned: bool, taint: SlurmTaint | None) -> bool:
    """Whether the Kubernetes side keeps the node out: cordoned, or our taint on it."""
    return cordoned or taint is not None


def slurm_unavailable(health_reason: str | None) -> bool:
    """Whether the Slurm side keeps the node out, from the ledger's health reason."""
    return bool(slurm_states(health_reason))


def disagree(cordoned: bool, taint: SlurmTaint | None, health_reason: str | None) -> bool:
    """Whether exactly one side keeps a co-managed node out."""
    return kube_unavailable(cordoned, taint) != slurm_unavailable(health_reason)


class Disagreements:
    """The nodes that disagree, each since the first look that found it so (seconds of a
    monotonic clock). Not thread-safe: its reconciler's thread alone looks."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def look(self, name: str, disagreeing: bool, now: float) -> None:
        if disagreeing:
            self._since.setdefault(name, now)
        else:
            self._since.pop(name, None)

    def keep(self, names: Collection[str]) -> None:
        """Forget every node but ``names`` (the co-managed ones)."""
        self._since = {n: t for n, t in self._since.items() if n in names}

    def clear(self) -> None:
        self._since.clear()

    def count(self) -> int:
        return len(self._since)

    def oldest(self, now: float) -> float:
        """Seconds the oldest disagreement has lasted; 0 when none."""
        return now - min(self._since.values()) if self._since else 0.0
