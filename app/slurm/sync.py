"""Slurm -> ledger: a background loop that mirrors what Slurm holds and repairs drift.

Each step:
1. Read nodes and jobs with ``?update_time=`` (an unchanged cluster answers 304, costs
   nothing); a full pass is forced now and then and whenever the ledger's nodes change.
2. Per ledger node mapped to a Slurm node (its alias, else the same name):
   - the running jobs' per-node allocations become the node's Slurm holdings (one
     snapshot-replace, so the event log says which jobs came and went); whatever the node
     reports allocated beyond those jobs is held under ``node:<name>`` so the ledger never
     undercounts Slurm;
   - Slurm states DOWN, DRAIN, INVALID_REG, NOT_RESPONDING, FAIL make it not admissible;
   - counts that differ from what the ledger withholds (slurmctld restart, reconfigure,
     slurmd re-registration) are pushed again and the drift is recorded.
3. Holdings still PENDING ``pending_timeout`` seconds after their admission started lost
   it (their replica was killed, their client went away before the answer): released,
   and the counts pushed, so Slurm does not withhold them forever.
With several replicas only the one holding the ``slurm-sync`` leadership (app.db.locks)
writes steps 2 and 3; the others keep reading Slurm (step 1: cheap, and their node sizes stay
current for node discovery) and stand by.
The loop is a thin shell around ``step()``, which tests call directly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta

from app.components import Health
from app.db.locks import Leadership
from app.ledger.errors import HoldingNotFound, LedgerError
from app.ledger.records import EventKind, HolderKind, NodeSpec, NodeView
from app.ledger.resources import Resources
from app.ledger.service import Ledger, SnapshotEntry
from app.ledger.snapshot import NodeViews
from app.metrics.registry import NO_METRICS, Metrics
from app.slurm.client import SlurmClient
from app.slurm.counts import MIB, current_counts, desired_counts, node_gpus, withheld
from app.slurm.errors import SlurmError
from app.slurm.gres import gres_count
from app.slurm.models import SlurmJob, SlurmNode
from app.slurm.push import Pusher

log = logging.getLogger(__name__)

UNHEALTHY_STATES = frozenset({"DOWN", "DRAIN", "INVALID_REG", "INVALID", "NOT_RESPONDING", "FAIL"})
FULL_PASS_EVERY = 30  # steps


def health_reason(node: SlurmNode | None, slurm_name: str) -> str | None:
    if node is None:
        return f"Slurm has no node {slurm_name!r}"
    bad = node.states & UNHEALTHY_STATES
    if not bad:
        return None
    text = f"Slurm node {node.name} is {'+'.join(sorted(node.states))}"
    return f"{text}: {node.reason}" if node.reason else text


def slurm_snapshot(node: SlurmNode, jobs: list[SlurmJob]) -> dict[str, SnapshotEntry]:
    """What Slurm holds on ``node``, per job, plus any allocation no job accounts for."""
    snapshot: dict[str, SnapshotEntry] = {}
    for job in jobs:
        for a in job.allocations:
            if a.node == node.name:
                snapshot[job.job_id] = SnapshotEntry(
                    f"{job.name} ({job.user})" if job.user else job.name,
                    Resources(a.cpus * 1000, a.memory_mb * MIB, a.gpus),
                )
    attributed = Resources.total([e.resources for e in snapshot.values()])
    reported = Resources(
        node.alloc_cpus * 1000, node.alloc_memory_mb * MIB, gres_count(node.gres_used, "gpu")
    )
    rest = Resources(
        max(0, reported.cpu_millis - attributed.cpu_millis),
        max(0, reported.memory_bytes - attributed.memory_bytes),
        max(0, reported.gpus - attributed.gpus),
    )
    if not rest.is_zero():
        snapshot[f"node:{node.name}"] = SnapshotEntry("allocated, no job listed yet", rest)
    return snapshot


def _by_node(jobs: tuple[SlurmJob, ...]) -> dict[str, list[SlurmJob]]:
    by_node: dict[str, list[SlurmJob]] = defaultdict(list)
    for job in jobs:
        if job.holds_resources:
            for node in {a.node for a in job.allocations}:
                by_node[node].append(job)
    return dict(by_node)


def _same(view: NodeView, snapshot: dict[str, SnapshotEntry]) -> bool:
    current = {
        h.holder.id: h.resources for h in view.holdings if h.holder.kind is HolderKind.SLURM_JOB
    }
    return current == {k: e.resources for k, e in snapshot.items()}


class SlurmSync:
    name = "slurm"

    def __init__(
        self,
        client: SlurmClient,
        ledger: Ledger,
        pusher: Pusher,
        *,
        interval: float = 1.0,
        register_nodes: bool = False,
        pending_timeout: float = 60.0,
        leadership: Leadership | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: Metrics = NO_METRICS,
        views: NodeViews | None = None,
    ) -> None:
        self.client = client
        # Every node each step: from memory (app.ledger.snapshot) in the service.
        self.node_views: NodeViews = views or ledger
        self.metrics = metrics
        metrics.slurm_sync_attached()
        metrics.leader("slurm-sync", False)
        self.leadership = leadership
        self.pending_timeout = pending_timeout
        self._pending_checked = float("-inf")
        self._standby = False
        self.ledger = ledger
        self.pusher = pusher
        self.interval = interval
        self.register_nodes = register_nodes
        self.monotonic = monotonic
        self._nodes: dict[str, SlurmNode] = {}
        self._jobs_by_node: dict[str, list[SlurmJob]] = {}
        self._nodes_time = 0
        self._jobs_time = 0
        self._ledger_key: tuple[tuple[str, str], ...] = ()
        self._steps = 0
        self._error: str | None = None
        self._last_ok: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ component

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="slurm-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 10)
        if self.leadership is not None:
            self.leadership.release()

    def node_size(self, slurm_name: str) -> Resources | None:
        """A Slurm node's size as last seen (CPUs, usable memory, GPUs); None if unknown."""
        node = self._nodes.get(slurm_name)
        if node is None:
            return None
        return Resources(node.cpus * 1000, node.usable_memory_mb * MIB, node_gpus(node))

    def jobs_on(self, slurm_name: str) -> list[SlurmJob]:
        """The jobs holding resources on a Slurm node, as last read."""
        return self._jobs_by_node.get(slurm_name, [])

    def health(self) -> Health:
        if self._error is not None:
            return Health("degraded", self._error)
        if self._last_ok is None:
            return Health("degraded", "not synced with Slurm yet")
        ago = f"{self.monotonic() - self._last_ok:.1f}s ago"
        if self._standby:
            return Health("ok", f"standby (another replica syncs); read Slurm {ago}")
        return Health("ok", f"synced {ago}")

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self.monotonic()
            try:
                with self.metrics.slurm_sync_step():
                    self.step()
            except Exception:  # keep syncing whatever one step hit; health() says why
                log.exception("Slurm sync step failed")
            self._stop.wait(max(0.0, self.interval - (self.monotonic() - started)))

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        try:
            changed = self._read_slurm()
        except SlurmError as exc:
            self._error = f"Slurm unreachable: {exc.message}"
            log.warning("Slurm sync: %s", exc)
            self.metrics.slurm_reached(False)
            return
        self.metrics.slurm_reached(True)
        leads = self.leadership is None or self.leadership.check()
        self.metrics.leader("slurm-sync", leads)
        if not leads:
            self._standby, self._ledger_key = True, ()  # a new leader starts with a full pass
            self.metrics.slurm_drifted_nodes(0)  # the leader compares, not this replica
            self._ok()
            return
        self._standby = False
        self._release_abandoned()
        owed = self._push_owed()
        views = self.node_views.list_nodes()
        if self.register_nodes:
            views = self._register(views)
        key = tuple(sorted((v.name, v.slurm_name) for v in views))
        self._steps += 1
        if not changed and key == self._ledger_key and self._steps % FULL_PASS_EVERY:
            self._report(owed)
            return
        self._ledger_key = key
        jobs_by_node = self._jobs_by_node
        failures = []
        drifted = 0
        for view in views:
            try:
                drifted += self._sync_node(view, jobs_by_node.get(view.slurm_name, []))
            except (SlurmError, LedgerError) as exc:
                failures.append(f"{view.name}: {exc}")
        self.metrics.slurm_drifted_nodes(drifted)
        self._report(owed + failures)

    def _push_owed(self) -> list[str]:
        """Push the nodes whose last push failed (admitted while Slurm was unreachable, with
        ``fail_open``): Slurm did not change, so nothing else here would look at them."""
        failures = []
        for name in self.pusher.owed():
            try:
                self.pusher.push(name, reason="retry")
            except (SlurmError, LedgerError) as exc:
                failures.append(f"{name}: {exc}")
        return failures

    def _report(self, failures: list[str]) -> None:
        if failures:
            self._error = "sync failed for " + "; ".join(failures[:5])
        else:
            self._ok()

    def _release_abandoned(self) -> None:
        # A query over every holding: every 10 s at most, not every step.
        if self.monotonic() - self._pending_checked < min(10.0, self.pending_timeout):
            return
        self._pending_checked = self.monotonic()
        cutoff = self.ledger.clock() - timedelta(seconds=self.pending_timeout)
        for holding in self.ledger.pending_before(cutoff):
            holder = holding.holder
            log.warning("releasing %s on %s: its admission never finished", holder, holding.node)
            with contextlib.suppress(HoldingNotFound):  # finished or released meanwhile
                self.ledger.release(
                    holder.id, holder.kind, reason="abandoned: its admission never finished"
                )
            self.pusher.push(holding.node, reason="release")

    def _ok(self) -> None:
        self._error = None
        self._last_ok = self.monotonic()

    def _read_slurm(self) -> bool:
        nodes = self.client.get_nodes(self._nodes_time or None)
        jobs = self.client.get_jobs(self._jobs_time or None)
        if nodes is not None:
            self._nodes = {n.name: n for n in nodes.items}
            self._nodes_time = nodes.last_update
        if jobs is not None:
            self._jobs_by_node = _by_node(jobs.items)
            self._jobs_time = jobs.last_update
        return nodes is not None or jobs is not None

    def _register(self, views: list[NodeView]) -> list[NodeView]:
        known = {v.slurm_name for v in views}
        for node in self._nodes.values():
            if node.name not in known and (capacity := self.node_size(node.name)):
                self.ledger.upsert_node(node.name, NodeSpec(capacity=capacity))
        return self.node_views.list_nodes() if len(known) < len(self._nodes) else views

    def _sync_node(self, view: NodeView, jobs: list[SlurmJob]) -> bool:
        """Whether Slurm's counts differed from what the ledger withholds."""
        node = self._nodes.get(view.slurm_name)
        reason = health_reason(node, view.slurm_name)
        if reason != view.health_reason:
            view = self.ledger.set_health(view.name, reason)
        if node is None:
            return False
        snapshot = slurm_snapshot(node, jobs)
        if not _same(view, snapshot):
            self.ledger.replace_holdings(view.name, HolderKind.SLURM_JOB, snapshot)
        drifted = current_counts(node) != desired_counts(node, withheld(view))
        if drifted:
            result = self.pusher.push(view.name, reason="drift")
            if result.updated and result.drifted:
                self.metrics.slurm_drift_corrected()
                self.ledger.record_event(
                    EventKind.SLURM_DRIFT,
                    view.name,
                    f"Slurm node {node.name} lost the pushed counts (slurmctld restart or "
                    f"reconfigure?); pushed {result.node.gres} again",
                    {"pushed": result.node.gres},
                )
        return drifted
