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

Job hints (app.slurm.hints): slurmctld's PrologSlurmctld/EpilogSlurmctld name a job that
started, ended or was requeued; the leader reads that one job (``GET job/{id}``), moves it in
its per-node job map and syncs only the nodes it was on or is on now, each read afresh
(``GET node/{name}``: states and ``gres_used`` are live there). A hint wakes the loop at
once; hints stored by another replica are picked up every ``HINT_POLL`` seconds. Jobs seen
COMPLETING still hold their nodes and are read again every poll until they let go, so an
Epilog hint that arrives while the job is COMPLETING still releases it. With
``full_sync_interval`` set (hints expected), the full listings are a reconcile read that
often, in the background (at 15,000 nodes one takes over a minute), and applied here, in the
loop's one thread: a job a hint read after the listing began keeps the hint's version, so an
older listing never undoes a newer hint. A changed slurmctld start time (``GET diag/``, each
step) forces a full listing at once.
The loop is a thin shell around ``step()`` and ``apply_hints()``, which tests call directly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta

from app.components import Health
from app.db.locks import Leadership
from app.ledger.errors import HoldingNotFound, LedgerError
from app.ledger.records import EventKind, HolderKind, NodeSpec, NodeView
from app.ledger.resources import Resources
from app.ledger.service import Ledger, SnapshotEntry
from app.ledger.snapshot import NodeViews
from app.metrics.registry import NO_METRICS, Metrics
from app.outages import log_failure
from app.slurm.client import SlurmClient
from app.slurm.counts import MIB, current_counts, desired_counts, node_gpus, withheld
from app.slurm.errors import SlurmError, SlurmUnavailable
from app.slurm.gres import gres_count
from app.slurm.hints import JobHints
from app.slurm.models import Listing, SlurmJob, SlurmNode
from app.slurm.push import Pusher

log = logging.getLogger(__name__)

UNHEALTHY_STATES = frozenset({"DOWN", "DRAIN", "INVALID_REG", "INVALID", "NOT_RESPONDING", "FAIL"})
FULL_PASS_EVERY = 30  # steps
HINT_POLL = 0.2  # seconds between the leader's looks for hints (and COMPLETING jobs)
SLOW_HINTS = 0.5  # seconds: applying hints slower than this is logged as a warning
MAX_REREADS = 10_000  # hinted jobs whose read failed, kept to read again; beyond: full pass

Listings = tuple[Listing[SlurmNode] | None, Listing[SlurmJob] | None]


def health_reason(node: SlurmNode | None, slurm_name: str) -> str | None:
    if node is None:
        return f"Slurm has no node {slurm_name!r}"
    bad = node.states & UNHEALTHY_STATES
    if not bad:
        return None
    text = f"Slurm node {node.name} is {'+'.join(sorted(node.states))}"
    return f"{text}: {node.reason}" if node.reason else text


def slurm_snapshot(
    node: SlurmNode, jobs: Iterable[SlurmJob], unlisted: Resources | None = None
) -> dict[str, SnapshotEntry]:
    """What Slurm holds on ``node``, per job, plus any allocation no job accounts for
    (``unlisted``; default: what the node reports allocated beyond ``jobs``)."""
    snapshot: dict[str, SnapshotEntry] = {}
    for job in jobs:
        if (held := job_on(job, node.name)) is not None:
            snapshot[job.job_id] = SnapshotEntry(
                f"{job.name} ({job.user})" if job.user else job.name, held
            )
    if unlisted is None:
        unlisted = unallocated_rest(node, [e.resources for e in snapshot.values()])
    if not unlisted.is_zero():
        snapshot[f"node:{node.name}"] = SnapshotEntry("allocated, no job listed yet", unlisted)
    return snapshot


def job_on(job: SlurmJob, node: str) -> Resources | None:
    """What ``job`` holds on ``node``; None when it holds nothing there."""
    for a in job.allocations:
        if a.node == node:
            return Resources(a.cpus * 1000, a.memory_mb * MIB, a.gpus)
    return None


def unallocated_rest(node: SlurmNode, held: list[Resources]) -> Resources:
    """What the node reports allocated (a full listing's figures) beyond what jobs hold."""
    attributed = Resources.total(held)
    reported = Resources(
        node.alloc_cpus * 1000, node.alloc_memory_mb * MIB, gres_count(node.gres_used, "gpu")
    )
    return _minus(reported, attributed)


def _minus(a: Resources, b: Resources) -> Resources:
    return Resources(
        max(0, a.cpu_millis - b.cpu_millis),
        max(0, a.memory_bytes - b.memory_bytes),
        max(0, a.gpus - b.gpus),
    )


def _nodes_of(job: SlurmJob | None) -> set[str]:
    return {a.node for a in job.allocations} if job is not None else set()


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
        full_sync_interval: float | None = None,
        hints: JobHints | None = None,
        register_nodes: bool = False,
        pending_timeout: float = 60.0,
        leadership: Leadership | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: Metrics = NO_METRICS,
        views: NodeViews | None = None,
    ) -> None:
        """``full_sync_interval``: seconds between full listings, read in the background,
        when slurmctld sends hints; None: listings every ``interval``, read in the step."""
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
        self.full_sync_interval = full_sync_interval
        self.hints = hints
        self.register_nodes = register_nodes
        self.monotonic = monotonic
        self._nodes: dict[str, SlurmNode] = {}
        # Jobs holding resources, by id and by node; both change only in the loop's thread.
        self._jobs: dict[str, SlurmJob] = {}
        self._jobs_by_node: dict[str, dict[str, SlurmJob]] = {}
        # Per node: allocated, no job listed (from the last full listing of nodes).
        self._unlisted: dict[str, Resources] = {}
        self._hinted_at: dict[str, float] = {}  # job id -> when a hint's read of it began
        self._rereads: set[str] = set()  # hinted jobs whose read failed
        self._names: dict[str, list[str]] = {}  # Slurm node -> ledger nodes mapped to it
        self._nodes_time = 0
        self._jobs_time = 0
        self._listing: Future[Listings] | None = None
        self._listing_started = 0.0
        self._listing_due = float("-inf")
        self._full_due = False  # a flood of hints, or slurmctld restarted
        self._ctld_started: int | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._ledger_key: tuple[tuple[str, str], ...] = ()  # (name, Slurm name) of each node
        self._views_seen: Sequence[NodeView] | None = None
        # Per ledger node: what its last compare depended on, when it found all in place.
        self._in_place: dict[str, tuple[object, ...]] = {}
        self._steps = 0
        self._error: str | None = None
        self._last_ok: float | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        if hints is not None:
            hints.on_hint(self._wake.set)

    # ------------------------------------------------------------------ component

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="slurm-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 10)
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)
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
        return list(self._jobs_by_node.get(slurm_name, {}).values())

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
            except Exception as exc:  # keep syncing whatever one step hit; health() says why
                log_failure(log, "Slurm sync step failed", exc)
            # Between steps: hints as they come (woken by this replica's own), and the ones
            # other replicas stored, every HINT_POLL.
            while (left := self.interval - (self.monotonic() - started)) > 0:
                self._wake.wait(min(left, HINT_POLL) if self.hints is not None else left)
                self._wake.clear()  # before taking: a hint stored from now on wakes us again
                if self._stop.is_set():
                    return
                if self.hints is not None and not self._standby and self._last_ok is not None:
                    try:
                        if failures := self.apply_hints():
                            self._report(failures)
                    except Exception as exc:
                        log_failure(log, "applying Slurm job hints failed", exc)

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        try:
            changed = self._read_slurm()
        except SlurmError as exc:
            self._error = f"Slurm unreachable: {exc.message}"
            # An outage is logged when it starts and ends (app.outages), not every step.
            log.log(
                logging.DEBUG if isinstance(exc, SlurmUnavailable) else logging.WARNING,
                "Slurm sync: %s",
                exc,
            )
            self.metrics.slurm_reached(False)
            return
        self.metrics.slurm_reached(True)
        leads = self.leadership is None or self.leadership.check()
        self.metrics.leader("slurm-sync", leads)
        if not leads:
            # A new leader starts with a full pass, comparing every node.
            self._standby, self._ledger_key, self._views_seen = True, (), None
            self._in_place = {}
            self.metrics.slurm_drifted_nodes(0)  # the leader compares, not this replica
            self._ok()
            return
        self._standby = False
        self._release_abandoned()
        owed = self._push_owed()
        views = self.node_views.list_nodes()
        # The snapshot hands out the same views while no node changed: an idle step then
        # costs no pass over them (15,000 nodes: ~40 ms a step, 4% of a core).
        if self.register_nodes and (changed or views is not self._views_seen):
            self._views_seen = None  # until registered: a failure is tried again next step
            views = self._register(views)
        renamed = False
        if views is not self._views_seen:
            self._views_seen = views
            key = tuple(sorted((v.name, v.slurm_name) for v in views))
            if renamed := key != self._ledger_key:
                self._ledger_key, self._names = key, {}
                for v in views:
                    self._names.setdefault(v.slurm_name, []).append(v.name)
        self._steps += 1
        failures: list[str] = []
        if changed or renamed or not self._steps % FULL_PASS_EVERY:
            drifted = 0
            hinted = self.monotonic()
            for view in views:
                try:
                    drifted += self._sync_node(view)
                except (SlurmError, LedgerError) as exc:
                    failures.append(f"{view.name}: {exc}")
                if self.hints is not None and self.monotonic() - hinted >= HINT_POLL:
                    # A long pass (every node pushed after a slurmctld restart: minutes at
                    # 15,000 nodes) must not hold hints up. Views it made stale cost at
                    # most a push that finds the counts in place.
                    failures += self.apply_hints()
                    hinted = self.monotonic()
            self.metrics.slurm_drifted_nodes(drifted)
        if self.hints is not None:
            failures += self.apply_hints()
        self._report(owed + failures)

    def apply_hints(self) -> list[str]:
        """Read each hinted job, each job seen COMPLETING and each whose read failed before,
        move it in the job map, and sync the nodes it was on or is on now. Failures, by
        node or job (a job whose read failed is read again next time)."""
        assert self.hints is not None
        taken = self.hints.take()
        if taken is None:
            log.warning("a flood of Slurm job hints: a full listing instead")
            self._full_due, taken = True, set()
        completing = {i for i, job in self._jobs.items() if "COMPLETING" in job.states}
        failures: list[str] = []
        touched: set[str] = set()
        due = sorted(taken | completing | self._rereads, key=lambda i: (len(i), i))
        if not due:
            return []
        started = self.monotonic()
        for n, job_id in enumerate(due):
            began = self.monotonic()
            try:
                job = self.client.get_job(job_id)
            except SlurmError as exc:
                failures.append(f"job {job_id}: {exc}")
                self._rereads.update(due[n:])  # Slurm away: every one of them again later
                if len(self._rereads) > MAX_REREADS:
                    self._full_due = True
                    self._rereads.clear()
                break
            self._rereads.discard(job_id)
            self._hinted_at[job_id] = began
            touched |= self._put_job(
                job_id, job if job is not None and job.holds_resources else None
            )
        read = self.monotonic()
        for slurm_name in sorted(touched):
            try:
                self._sync_slurm_node(slurm_name)
            except (SlurmError, LedgerError) as exc:
                failures.append(f"{slurm_name}: {exc}")
        done = self.monotonic()
        # Hints exist to be applied within a fraction of a second: say when they were not.
        log.log(
            logging.WARNING if done - started > SLOW_HINTS else logging.DEBUG,
            "Slurm job hints: read %d jobs in %.3fs, synced %d nodes in %.3fs (hinted: %s)",
            len(due),
            read - started,
            len(touched),
            done - read,
            ", ".join(sorted(taken, key=lambda i: (len(i), i))[:10]) or "none",
        )
        return failures

    def _put_job(self, job_id: str, job: SlurmJob | None) -> set[str]:
        """Put one job's latest state into the job map; the nodes whose jobs changed."""
        old = self._jobs.pop(job_id, None)
        if job is not None:
            self._jobs[job_id] = job
        if old == job:
            return set()
        # New dicts, never changed in place: the gate reads them from other threads.
        by_node = self._jobs_by_node
        for node in _nodes_of(old):
            by_node[node] = {i: j for i, j in by_node.get(node, {}).items() if i != job_id}
        for node in _nodes_of(job):
            assert job is not None
            by_node[node] = {**by_node.get(node, {}), job_id: job}
            if node not in _nodes_of(old) and (held := job_on(job, node)) is not None:
                # Newly listed here: it was part of what the node reported allocated.
                self._unlisted[node] = _minus(self._unlisted.get(node, Resources.ZERO), held)
        return _nodes_of(old) | _nodes_of(job)

    def _sync_slurm_node(self, slurm_name: str) -> None:
        """Sync the ledger nodes mapped to one Slurm node, read afresh."""
        names = self._names.get(slurm_name)
        if not names:
            return
        self._remember(self.client.get_node(slurm_name))
        for view in self.ledger.views_named(names):
            self._sync_node(view)

    def _remember(self, node: SlurmNode) -> None:
        """Keep a single-node read (a hint's, or a push's read-back) as the node's latest."""
        if (listed := self._nodes.get(node.name)) is not None:
            # A single-node read's alloc_* figures are stale (app.slurm.gate): keep the
            # listing's, which only the next listing replaces.
            node = replace(
                node, alloc_cpus=listed.alloc_cpus, alloc_memory_mb=listed.alloc_memory_mb
            )
        self._nodes[node.name] = node

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

    # ------------------------------------------------------------------ full listings

    def _read_slurm(self) -> bool:
        """Whether a listing brought news. Without ``full_sync_interval``: both listings,
        read now. With it: started in the background when due (or slurmctld restarted, or
        hints flooded), applied once read."""
        if self.full_sync_interval is None:
            began = self.monotonic()
            return self._apply_listings(self._read_listings(), began)
        if self._restarted():
            self._full_due = True
        if self._listing is None:
            if self._full_due or self.monotonic() >= self._listing_due:
                if self._full_due:
                    self._nodes_time = self._jobs_time = 0
                self._full_due = False
                self._listing_started = self.monotonic()
                self._reader = self._reader or ThreadPoolExecutor(1, "slurm-listing")
                self._listing = self._reader.submit(self._read_listings)
            return False
        if not self._listing.done():
            return False
        listing, self._listing = self._listing, None
        try:
            listings = listing.result()
        except SlurmError:
            self._listing_due = float("-inf")  # again at the next step
            raise
        self._listing_due = self._listing_started + self.full_sync_interval
        return self._apply_listings(listings, self._listing_started)

    def _restarted(self) -> bool:
        started = self.client.started_at()
        restarted = self._ctld_started is not None and started != self._ctld_started
        if restarted:
            log.info("slurmctld restarted: a full listing now")
        self._ctld_started = started
        return restarted

    def _read_listings(self) -> Listings:
        return (
            self.client.get_nodes(self._nodes_time or None),
            self.client.get_jobs(self._jobs_time or None),
        )

    def _apply_listings(self, listings: Listings, began: float) -> bool:
        """Apply listings read from ``began`` on; a job a hint read after that keeps the
        hint's version (the listing may predate its start, end or requeue)."""
        nodes, jobs = listings
        newer = {i for i, at in self._hinted_at.items() if at >= began}
        self._hinted_at = {i: self._hinted_at[i] for i in newer}
        if nodes is not None:
            self._nodes = {n.name: n for n in nodes.items}
            self._nodes_time = nodes.last_update
        if jobs is not None:
            self._jobs_time = jobs.last_update
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
                name: unallocated_rest(
                    node, [h for j in self.jobs_on(name) if (h := job_on(j, name)) is not None]
                )
                for name, node in self._nodes.items()
            }
        return nodes is not None or jobs is not None

    def _register(self, views: Sequence[NodeView]) -> Sequence[NodeView]:
        known = {v.slurm_name for v in views}
        for node in self._nodes.values():
            if node.name not in known and (capacity := self.node_size(node.name)):
                self.ledger.upsert_node(
                    node.name,
                    NodeSpec(capacity=capacity),
                    health_reason=health_reason(node, node.name),
                )
        return self.node_views.list_nodes() if len(known) < len(self._nodes) else views

    def _sync_node(self, view: NodeView) -> bool:
        """Whether Slurm's counts differed from what the ledger withholds."""
        node = self._nodes.get(view.slurm_name)
        # All it depends on, each immutable or replaced whole when it changes: if each is
        # the very object a compare found in place, this one would find the same (a pass
        # over 15,000 nodes that changed nothing: ~1 s of CPU, every FULL_PASS_EVERY steps).
        inputs = (
            view,
            node,
            self._jobs_by_node.get(view.slurm_name),
            self._unlisted.get(view.slurm_name),
        )
        last = self._in_place.pop(view.name, None)
        if last is not None and all(a is b for a, b in zip(last, inputs, strict=True)):
            self._in_place[view.name] = last
            return False
        reason = health_reason(node, view.slurm_name)
        in_place = reason == view.health_reason
        if not in_place:
            view = self.ledger.set_health(view.name, reason)
        if node is None:
            return False
        unlisted = self._unlisted.get(node.name, Resources.ZERO)
        snapshot = slurm_snapshot(node, self.jobs_on(node.name), unlisted)
        if not _same(view, snapshot):
            in_place = False
            self.ledger.replace_holdings(view.name, HolderKind.SLURM_JOB, snapshot)
        drifted = current_counts(node) != desired_counts(node, withheld(view))
        if in_place and not drifted:
            self._in_place[view.name] = inputs
        if drifted:
            result = self.pusher.push(view.name, reason="drift")
            # Else every later pass would see the listing's old counts and push again: at
            # 15,000 nodes, a read per node per pass, while hints wait.
            self._remember(result.node)
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
