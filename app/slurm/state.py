"""Slurm's state as the sync last read it: nodes, the jobs holding resources, by node.

Why one owner: the sync's thread reads Slurm (full listings, hinted jobs, a push's
read-back) and is the only one that changes this cache, so it needs no lock. Other threads
(node discovery sizes Kubernetes nodes by it, the gate names the jobs on a node it refuses)
read a ``SlurmSnapshot``: immutable, replaced whole when the owner publishes, after each
batch of changes (a listing applied, hinted jobs read, a pass).

Invariants:
- ``jobs`` and ``jobs_by_node`` hold the same jobs, each under every node it is allocated on;
- a job hinted after a listing began keeps the hint's version when that listing is applied
  (the listing may predate its start, end or requeue);
- ``unlisted`` (per node: allocated, no job listed) comes from the last full listing of
  nodes, less what jobs listed since on that node hold;
- nodes, per-node job maps and unlisted amounts are replaced, never changed in place, so the
  reconciler can tell by identity that nothing it depends on changed (app.slurm.reconcile).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from app.core.counts import job_on, node_size
from app.core.plan import floored_minus, unallocated_rest
from app.core.resources import Resources
from app.core.slurm_models import Listing, SlurmJob, SlurmNode

Listings = tuple[Listing[SlurmNode] | None, Listing[SlurmJob] | None]
_NO_JOBS: Mapping[str, SlurmJob] = MappingProxyType({})  # one object: compared by identity


@dataclass(frozen=True, slots=True)
class Observed:
    """One Slurm node as the cache has it (the reconciler's input)."""

    node: SlurmNode | None
    jobs: Mapping[str, SlurmJob]  # the jobs holding resources on it, by id
    unlisted: Resources  # allocated, no job listed


@dataclass(frozen=True, slots=True)
class SlurmSnapshot:
    """What other threads read: immutable, as the sync last published it."""

    nodes: Mapping[str, SlurmNode]
    jobs_by_node: Mapping[str, Mapping[str, SlurmJob]]

    def node_size(self, slurm_name: str) -> Resources | None:
        """A Slurm node's size as last seen (CPUs, usable memory, GPUs); None if unknown."""
        node = self.nodes.get(slurm_name)
        return node_size(node) if node is not None else None

    def jobs_on(self, slurm_name: str) -> list[SlurmJob]:
        """The jobs holding resources on a Slurm node, as last read."""
        return list(self.jobs_by_node.get(slurm_name, {}).values())


class SlurmState:
    """The cache; every method but ``snapshot`` is for the owning (sync) thread only."""

    def __init__(self) -> None:
        self._nodes: dict[str, SlurmNode] = {}
        self._jobs: dict[str, SlurmJob] = {}
        self._jobs_by_node: dict[str, dict[str, SlurmJob]] = {}
        self._unlisted: dict[str, Resources] = {}
        self._hinted_at: dict[str, float] = {}  # job id -> when a hint's read of it began
        self._node_read_at: dict[str, float] = {}  # node -> when a hint's read of it began
        self._held_back: tuple[str, ...] = ()  # pending jobs slurmctld marked non-runnable
        self._on_marker = False  # a pending job's extra constraint names the queue's marker
        # The partitions of jobs waiting for resources (SlurmJob.waits_for_resources); a
        # waiting job that names none makes every node contended.
        self._waiting_in: frozenset[str] = frozenset()
        self._waiting_anywhere = False
        # Refusals the first job listing showed: from before this process, not its to answer.
        self._old_refusals: frozenset[str] | None = None
        self._published = SlurmSnapshot(MappingProxyType({}), MappingProxyType({}))
        self._dirty = False

    # ------------------------------------------------------------------ other threads

    def snapshot(self) -> SlurmSnapshot:
        return self._published

    # ------------------------------------------------------------------ the owner

    def publish(self) -> None:
        """Hand other threads what changed since the last publish."""
        if self._dirty:
            self._dirty = False
            self._published = SlurmSnapshot(
                MappingProxyType(dict(self._nodes)), MappingProxyType(dict(self._jobs_by_node))
            )

    def observe(self, slurm_name: str) -> Observed:
        return Observed(
            self._nodes.get(slurm_name),
            self._jobs_by_node.get(slurm_name, _NO_JOBS),
            self._unlisted.get(slurm_name, Resources.ZERO),
        )

    def nodes(self) -> Collection[SlurmNode]:
        return self._nodes.values()

    def jobs(self) -> Collection[SlurmJob]:
        """Every job as last read."""
        return self._jobs.values()

    def held_back(self) -> tuple[str, ...]:
        """The jobs the last job listing showed held back (SlurmJob.held_back), by id."""
        return self._held_back

    def jobs_on_marker(self) -> bool:
        """Whether a job of the last job listing pends on the jobs queue's marker
        (SlurmJob.needs_queue_marker)."""
        return self._on_marker

    def contended(self) -> set[str]:
        """The nodes (Slurm names) in a partition where a job of the last job listing waits
        for resources, or was refused at submit since this process began listing
        (SlurmJob.waits_for_resources): their headroom goes back to Slurm
        (app.core.headroom)."""
        if self._waiting_anywhere:
            return set(self._nodes)
        if not self._waiting_in:
            return set()
        return {name for name, n in self._nodes.items() if n.partitions & self._waiting_in}

    def completing(self) -> set[str]:
        """The jobs seen COMPLETING: they hold their nodes until read otherwise."""
        return {i for i, job in self._jobs.items() if "COMPLETING" in job.states}

    def put_hinted(self, job_id: str, job: SlurmJob | None, read_at: float) -> set[str]:
        """A hinted job as read from ``read_at`` on (None: it holds nothing); the nodes whose
        jobs changed."""
        self._hinted_at[job_id] = read_at
        return self._put_job(job_id, job)

    def remember(self, node: SlurmNode, *, read_at: float | None = None) -> None:
        """Keep a single-node read (a hint's, or a push's read-back) as the node's latest;
        ``read_at``: a hint's, when its read began (a listing begun before keeps it)."""
        if (listed := self._nodes.get(node.name)) is not None:
            node = _with_listed_allocation(node, listed)
        self._nodes[node.name] = node
        if read_at is not None:
            self._node_read_at[node.name] = read_at
        self._dirty = True

    def apply_listings(self, listings: Listings, began: float) -> bool:
        """Apply listings read from ``began`` on (None: unchanged since the last); a job a
        hint read after that keeps the hint's version. Whether either brought news."""
        nodes, jobs = listings
        newer = {i for i, at in self._hinted_at.items() if at >= began}
        self._hinted_at = {i: self._hinted_at[i] for i in newer}
        read = {n: at for n, at in self._node_read_at.items() if at >= began}
        self._node_read_at = read
        if nodes is not None:
            # A node a hint read after this listing began keeps the hint's states (a drain
            # seen, not undone by the older listing), with the listing's allocation.
            self._nodes = {
                n.name: _with_listed_allocation(self._nodes[n.name], n)
                if n.name in read and n.name in self._nodes
                else n
                for n in nodes.items
            }
        if jobs is not None:
            self._held_back = tuple(j.job_id for j in jobs.items if j.held_back)
            self._on_marker = any(j.needs_queue_marker for j in jobs.items)
            if self._old_refusals is None:
                self._old_refusals = frozenset(j.job_id for j in jobs.items if j.refused_at_submit)
            waiting = [
                j.partitions
                for j in jobs.items
                if j.waits_for_resources and j.job_id not in self._old_refusals
            ]
            self._waiting_in = frozenset().union(*waiting)
            self._waiting_anywhere = any(not partitions for partitions in waiting)
            listed = {
                j.job_id: j for j in jobs.items if j.holds_resources and j.job_id not in newer
            }
            listed.update((i, self._jobs[i]) for i in newer if i in self._jobs)
            if nodes is None:  # the nodes' figures are older: only jobs newly listed change
                for job_id in self._jobs.keys() | listed.keys():
                    self._put_job(job_id, listed.get(job_id))
            else:
                by_node: dict[str, dict[str, SlurmJob]] = {}
                for job_id, job in listed.items():
                    for node in _nodes_of(job):
                        by_node.setdefault(node, {})[job_id] = job
                self._jobs, self._jobs_by_node = listed, by_node
        if nodes is not None:
            self._unlisted = {
                name: unallocated_rest(node, self._held_on(name))
                for name, node in self._nodes.items()
            }
        changed = nodes is not None or jobs is not None
        self._dirty = self._dirty or changed
        return changed

    def _held_on(self, slurm_name: str) -> list[Resources]:
        jobs = self._jobs_by_node.get(slurm_name, {}).values()
        return [h for j in jobs if (h := job_on(j, slurm_name)) is not None]

    def _put_job(self, job_id: str, job: SlurmJob | None) -> set[str]:
        """Put one job's latest state into the job maps; the nodes whose jobs changed."""
        old = self._jobs.pop(job_id, None)
        if job is not None:
            self._jobs[job_id] = job
        if old == job:
            return set()
        self._dirty = True
        # New dicts, never changed in place (the reconciler compares them by identity).
        by_node = self._jobs_by_node
        for node in _nodes_of(old):
            by_node[node] = {i: j for i, j in by_node.get(node, {}).items() if i != job_id}
        for node in _nodes_of(job):
            assert job is not None
            by_node[node] = {**by_node.get(node, {}), job_id: job}
            if node not in _nodes_of(old) and (held := job_on(job, node)) is not None:
                # Newly listed here: it was part of what the node reported allocated.
                self._unlisted[node] = floored_minus(self._unlisted.get(node, Resources.ZERO), held)
        return _nodes_of(old) | _nodes_of(job)


def _with_listed_allocation(node: SlurmNode, listed: SlurmNode) -> SlurmNode:
    """``node`` (a single-node read) with ``listed``'s alloc_* figures: a single read's are
    stale (app.slurm.gate); only the next listing replaces them."""
    return replace(node, alloc_cpus=listed.alloc_cpus, alloc_memory_mb=listed.alloc_memory_mb)


def _nodes_of(job: SlurmJob | None) -> set[str]:
    return {a.node for a in job.allocations} if job is not None else set()
