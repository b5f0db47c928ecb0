"""What reconciling one ledger node with its Slurm node must do: a pure plan.

Why pure: deciding and writing in one pass (health, holdings, push, event interleaved)
could only be tested against a ledger and a slurmrestd. Here the decision is a function of
plain data, the ledger's view of the node and Slurm's node and jobs as last read, so every
case is a table test; app.slurm.reconcile observes, calls ``plan_node`` and applies the
plan through the ledger and the pusher, in the plan's order (health, holdings, push, drift
event).

Invariants:
- a node Slurm does not list only gets a health reason (nothing to hold or push);
- Slurm-job holdings are replaced only when they differ from what Slurm holds: the jobs'
  per-node allocations, plus whatever the node reports allocated beyond them held under
  ``node:<name>``, so the ledger never undercounts Slurm; the node's hold jobs (a GPU pod's
  devices held in Slurm, ``LedgerHolds``: recorded by the ledger, the service's user's)
  are the pod's holding already and are no Slurm job's;
- counts are pushed only when Slurm's differ from what the ledger withholds (slurmctld
  restart, reconfigure, slurmd re-registration).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from app.core.counts import MIB, current_counts, desired_counts, in_place, job_on, withheld
from app.core.gres import gres_count
from app.core.records import HolderKind, Holding, NodeView, SnapshotEntry
from app.core.resources import Resources
from app.core.slurm_models import LedgerHolds, SlurmJob, SlurmNode

UNHEALTHY_STATES = frozenset({"DOWN", "DRAIN", "INVALID_REG", "INVALID", "NOT_RESPONDING", "FAIL"})
UNLISTED = "Slurm has no node "  # how the health reason of a node Slurm does not list begins


@dataclass(frozen=True, slots=True)
class HealthChange:
    """The ledger's health reason for the node must become ``reason`` (None: healthy)."""

    reason: str | None


@dataclass(frozen=True, slots=True)
class Push:
    """Slurm's counts differ from what the ledger withholds: push them again. No counts
    here: the pusher computes them under the node's lock, from the view as it is then
    (an admission may have changed it since this plan)."""

    slurm_name: str


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What to write, in this order; None: already in place."""

    health: HealthChange | None
    holdings: Mapping[str, SnapshotEntry] | None  # the node's Slurm-job holdings, whole
    push: Push | None
    deferred: bool = False  # the jobs' listing is older than a holding it would overcommit

    @property
    def settled(self) -> bool:
        """Nothing to write: the node is in place."""
        return (
            self.health is None
            and self.holdings is None
            and self.push is None
            and not self.deferred
        )


def plan_node(
    view: NodeView,
    node: SlurmNode | None,
    jobs: Iterable[SlurmJob],
    unlisted: Resources = Resources.ZERO,
    listed_at: datetime | None = None,
    *,
    hold_user: str,
    marked: bool = False,
) -> NodePlan:
    """Reconcile ``view`` with Slurm's ``node`` (None: Slurm does not list it), the ``jobs``
    holding resources on it, and ``unlisted``: what the node reported allocated beyond
    those jobs at the last full listing, which began at ``listed_at``. ``hold_user``: the
    service's Slurm user; of its jobs, those whose ids ``view``'s holdings recorded are
    their hold jobs (``LedgerHolds``). A push is due when
    the counts differ from what the ledger withholds, or, ``marked`` (jobs queue behind
    pods), ``extra`` does (app.core.counts.in_place).

    Jobs that would overcommit the node beside a holding confirmed after ``listed_at`` are
    not written (``deferred``): Slurm confirmed that holding after the listing was read, so
    a job the listing shows where it fits no more has ended since (it freed what the holding
    took). Writing it would refuse every admission on the node until the next listing; the
    ledger's Slurm-job holdings are not what keeps a pod off a job's resources (the gate's
    read-back and the counts are), so waiting for a newer listing costs no safety."""
    jobs = list(jobs)
    reason = health_reason(node, view.slurm_name) or holds_gone(view, jobs, listed_at)
    health = None if reason == view.health_reason else HealthChange(reason)
    if node is None:
        return NodePlan(health, None, None)
    holdings = slurm_snapshot(node, jobs, LedgerHolds.of(hold_user, view.holdings), unlisted)
    held = withheld(view)
    # Marked, ``extra`` too: a node without the marker is one no job queues behind pods on.
    settled = in_place(node, held, marked=True) if marked else (
        current_counts(node) == desired_counts(node, held)
    )  # fmt: skip
    push = None if settled else Push(node.name)
    if _same(view, holdings):
        return NodePlan(health, None, push)
    if _outdated(view, holdings, listed_at):
        return NodePlan(health, None, push, deferred=True)
    return NodePlan(health, holdings, push)


def _outdated(
    view: NodeView, snapshot: Mapping[str, SnapshotEntry], listed_at: datetime | None
) -> bool:
    """Whether ``snapshot`` overcommits the node only beside holdings confirmed after the
    listing it comes from began (``listed_at``)."""
    if listed_at is None:
        return False
    slurm = Resources.total([e.resources for e in snapshot.values()])
    others = [h for h in view.holdings if h.holder.kind is not HolderKind.SLURM_JOB]
    if (Resources.total([h.resources for h in others]) + slurm).fits_within(view.allocatable):
        return False
    return any(h.updated_at > listed_at for h in others)


def health_reason(node: SlurmNode | None, slurm_name: str) -> str | None:
    """Why Slurm makes the node not admissible (its states DOWN, DRAIN, INVALID_REG,
    NOT_RESPONDING, FAIL, or no such node); None when healthy. ``slurm_states`` reads the
    states back."""
    if node is None:
        return f"{UNLISTED}{slurm_name!r}"
    bad = node.states & UNHEALTHY_STATES
    if not bad:
        return None
    text = f"Slurm node {node.name} is {'+'.join(sorted(node.states))}"
    return f"{text}: {node.reason}" if node.reason else text


_STATED = re.compile(r"Slurm node \S+ is (?P<states>[A-Z_+]+)(?:: |$)")


def slurm_states(reason: str | None) -> frozenset[str]:
    """The states that keep a node out, from a reason ``health_reason`` wrote: what the
    ledger stores (empty for any other reason, e.g. no such node, or a GPU hold gone)."""
    stated = _STATED.match(reason or "")
    if stated is None:
        return frozenset()
    return frozenset(stated["states"].split("+")) & UNHEALTHY_STATES


def slurm_lists(reason: str | None) -> bool:
    """Whether Slurm listed the node at the last sync, from a reason ``health_reason`` wrote."""
    return not (reason or "").startswith(UNLISTED)


def slurm_reason(reason: str | None) -> str:
    """Slurm's own reason (``scontrol ... reason=``), from a reason ``health_reason``
    wrote; "" when it gave none."""
    stated = _STATED.match(reason or "")
    return (reason or "")[stated.end() :] if stated is not None else ""


def hold_gone(holding: Holding, listed: Collection[str], listed_at: datetime) -> bool:
    """Whether ``holding``'s GPU devices lost their Slurm hold job (app.slurm.holds): it
    names one that the jobs ``listed`` (ids, from a listing begun at ``listed_at``) do not
    have, and was confirmed before that listing began, so the listing would show it."""
    return (
        bool(holding.devices)
        and holding.slurm_hold is not None
        and holding.slurm_hold not in listed
        and holding.updated_at < listed_at
    )


def holds_gone(view: NodeView, jobs: Iterable[SlurmJob], listed_at: datetime | None) -> str | None:
    """Why the node is not admissible while a GPU pod's hold job is gone (an operator's
    scancel, the node DOWN): until the sweep holds its devices again, every GPU here is
    withheld from Slurm (app.core.counts.withheld). None when every hold is listed."""
    if listed_at is None:
        return None
    # A hold COMPLETING is ending (cancelled, or killed with its node): on a node resumed
    # before it finished, Slurm would start a queued job on its device.
    listed = {job.job_id for job in jobs if "COMPLETING" not in job.states}
    gone = [h for h in view.holdings if hold_gone(h, listed, listed_at)]
    if not gone:
        return None
    named = ", ".join(
        f"{h.holder.display_name or h.holder.id} "
        f"(devices {list(h.device_indices)}, job {h.slurm_hold})"
        for h in gone[:3]
    )
    return f"Slurm hold jobs of GPU devices gone, held again soon: {named}"


def slurm_snapshot(
    node: SlurmNode,
    jobs: Iterable[SlurmJob],
    holds: LedgerHolds,
    unlisted: Resources | None = None,
) -> dict[str, SnapshotEntry]:
    """What Slurm holds on ``node``, per job, plus any allocation no job accounts for
    (``unlisted``; default: what the node reports allocated beyond ``jobs``). A hold job of
    the ledger's (``holds``) is a pod the ledger already holds: it accounts for its
    allocation but is no Slurm job's holding."""
    snapshot: dict[str, SnapshotEntry] = {}
    accounted: list[Resources] = []
    for job in jobs:
        if (held := job_on(job, node.name)) is None:
            continue
        accounted.append(held)
        if not holds.owns(job):
            snapshot[job.job_id] = SnapshotEntry(
                f"{job.name} ({job.user})" if job.user else job.name, held
            )
    if unlisted is None:
        unlisted = unallocated_rest(node, accounted)
    if not unlisted.is_zero():
        snapshot[f"node:{node.name}"] = SnapshotEntry("allocated, no job listed yet", unlisted)
    return snapshot


def unallocated_rest(node: SlurmNode, held: list[Resources]) -> Resources:
    """What the node reports allocated (a full listing's figures) beyond what jobs hold."""
    attributed = Resources.total(held)
    reported = Resources(
        node.alloc_cpus * 1000, node.alloc_memory_mb * MIB, gres_count(node.gres_used, "gpu")
    )
    return floored_minus(reported, attributed)


def floored_minus(a: Resources, b: Resources) -> Resources:
    """``a - b``, each amount at least 0."""
    return Resources(
        max(0, a.cpu_millis - b.cpu_millis),
        max(0, a.memory_bytes - b.memory_bytes),
        max(0, a.gpus - b.gpus),
    )


def _same(view: NodeView, snapshot: Mapping[str, SnapshotEntry]) -> bool:
    current = {
        h.holder.id: h.resources for h in view.holdings if h.holder.kind is HolderKind.SLURM_JOB
    }
    return current == {k: e.resources for k, e in snapshot.items()}
