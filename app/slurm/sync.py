"""Slurm -> ledger: the background loop that mirrors what Slurm holds and repairs drift.

Each step (``step()``, which tests call directly):
1. Read slurmctld's start time, the headroom's witness (app.slurm.witness): when Slurm may
   have changed counts unseen, every grant in the ledger is voided before it is trusted
   again (every replica, leader or not: each admits inside the grants). Then read Slurm's
   listings into the cache (app.slurm.listings, app.slurm.state); a full pass over the
   ledger's nodes is forced now and then and whenever the ledger's nodes change.
2. As the leader only: release abandoned holds (app.slurm.abandoned), push the nodes whose
   last push failed, register unknown Slurm nodes when asked (app.slurm.registration), and
   reconcile each ledger node mapped to a Slurm node (its alias, else the same name) when a
   listing brought news (app.slurm.reconcile: health, Slurm-job holdings, counts), and
   have slurmctld evaluate again the jobs it held back for counts that since rose
   (app.slurm.held_back).
3. Apply job hints (app.slurm.hint_sync), also every HINT_POLL seconds between steps and
   during a long pass, so they are never held up for long.
With several replicas only the one holding the ``slurm-sync`` leadership (app.db.locks)
writes; the others keep reading Slurm (step 1: cheap, and their node sizes stay current for
node discovery) and stand by. The loop is a thin shell around ``step()`` and
``apply_hints()``; ``health()`` says whether the last step reached Slurm and wrote all.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta

from app.core.components import Health
from app.core.errors import NodeledgerError
from app.core.records import NodeView
from app.db.locks import Leadership
from app.ledger.service import Ledger
from app.ledger.snapshot import NodeViews
from app.loops import Loop
from app.metrics.registry import NO_METRICS, Metrics
from app.outages import log_failure
from app.slurm.abandoned import AbandonedHolds
from app.slurm.client import SlurmClient
from app.slurm.errors import SlurmError, SlurmUnavailable
from app.slurm.held_back import HeldBackJobs
from app.slurm.hint_queue import HintQueue
from app.slurm.hint_sync import STALE_NODE_HINTS, HintSync
from app.slurm.hold_sweep import HoldSweep
from app.slurm.holds import HoldJobs
from app.slurm.listings import ListingReader
from app.slurm.push import Pusher
from app.slurm.reconcile import NodeReconciler
from app.slurm.registration import register_unknown
from app.slurm.state import SlurmState

log = logging.getLogger(__name__)

FULL_PASS_EVERY = 30  # steps
HINT_POLL = 0.2  # seconds between the leader's looks for hints (and COMPLETING jobs)


class SlurmSync:
    name = "slurm"

    def __init__(
        self,
        client: SlurmClient,
        ledger: Ledger,
        pusher: Pusher,
        *,
        holds: HoldJobs,
        interval: float = 1.0,
        full_sync_interval: float | None = None,
        hints: HintQueue | None = None,
        register_nodes: bool = False,
        pending_timeout: float = 60.0,
        leadership: Leadership | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: Metrics = NO_METRICS,
        views: NodeViews | None = None,
    ) -> None:
        """``full_sync_interval``: seconds between full listings, read in the background,
        when slurmctld sends hints; None: listings every ``interval``, read in the step.
        ``holds``: the GPU hold jobs (docs/gpu-identity.md), whose orphans the leader ends."""
        self.client = client
        self.ledger = ledger
        self.pusher = pusher
        self.witness = pusher.witness
        self._voided = False  # the grants were voided since the witness was last in doubt
        # Every node each step: from memory (app.ledger.snapshot) in the service.
        self.node_views: NodeViews = views or ledger
        self.metrics = metrics
        metrics.slurm_sync_attached()
        metrics.leader("slurm-sync", False)
        self.leadership = leadership
        self.interval = interval
        self.register_nodes = register_nodes
        self.monotonic = monotonic
        # What other threads read: ``state.snapshot()`` (node sizes, the jobs on a node).
        self.state = SlurmState()
        self.listings = ListingReader(
            client,
            self.state,
            full_sync_interval=full_sync_interval,
            monotonic=monotonic,
            clock=ledger.clock,
        )
        self.reconciler = NodeReconciler(
            client,
            ledger,
            pusher,
            self.state,
            metrics=metrics,
            listed_at=lambda: self.listings.jobs_listed_at,
        )
        self.abandoned = AbandonedHolds(
            ledger, pusher, timeout=pending_timeout, monotonic=monotonic
        )
        self.hold_sweep = HoldSweep(holds, ledger)
        self.held_back = HeldBackJobs(client)
        self.hinted: HintSync | None = None
        if hints is not None:
            self.hinted = HintSync(
                client,
                hints,
                self.state,
                self.reconciler,
                full_listing=self.listings.force_full,
                monotonic=monotonic,
                heard=metrics.slurm_node_hint_heard,
            )
        self._standby = False
        # Whether the last read of Slurm's listings succeeded (a failed read is not "no
        # jobs": the device taints keep theirs meanwhile).
        self.listings_read = False
        # The ledger nodes where Slurm jobs wait for resources, as the leader last saw: the
        # gate keeps their admissions off the headroom (app.slurm.gate.headroom_open).
        self.contended: frozenset[str] = frozenset()
        self._views_seen: Sequence[NodeView] | None = None
        self._steps = 0
        self._error: str | None = None
        self._last_ok: float | None = None
        self._due = -math.inf  # when the next step is (monotonic)
        self._loop = Loop(
            "slurm-sync", self._round, interval=interval, logger=log, what="Slurm sync"
        )
        if hints is not None:
            hints.on_hint(self._loop.wake)

    # ------------------------------------------------------------------ component

    def start(self) -> None:
        # The witness first, before the service answers: admissions inside the headroom
        # skip Slurm from the first one on when Slurm is there (app.slurm.witness).
        try:
            self._witnessed()
        except SlurmError as exc:
            self._doubted(f"Slurm unreachable: {exc.message}")
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(timeout=self.interval + 10)
        self.listings.close()
        if self.leadership is not None:
            self.leadership.release()

    def health(self) -> Health:
        if self._error is not None:
            return Health("degraded", self._error)
        if self._last_ok is None:
            return Health("degraded", "not synced with Slurm yet")
        ago = f"{self.monotonic() - self._last_ok:.1f}s ago"
        if self._standby:
            return Health("ok", f"standby (another replica syncs); read Slurm {ago}")
        if (stale := self._node_hints_stale()) is not None:
            return Health("degraded", f"synced {ago}; {stale}")
        return Health("ok", f"synced {ago}")

    def _node_hints_stale(self) -> str | None:
        """What /readyz says when slurmctld's node watcher has gone quiet; still ready:
        hints only speed things up, each full listing still brings every node's state."""
        quiet = self.hinted.quiet_for() if self.hinted is not None else None
        if quiet is None or quiet <= STALE_NODE_HINTS:
            return None
        since = (self.ledger.clock() - timedelta(seconds=quiet)).isoformat(timespec="seconds")
        return (
            f"node hints stale since {since} (none for {quiet:.0f}s): slurmctld's "
            "node_features/k8s_resources watcher stopped or its hook fails; drains and DOWN "
            "nodes reach the ledger at the next full listing"
        )

    def _round(self) -> float:
        """The loop's step: a step every ``interval``; between steps, hints as they come
        (woken by this replica's own) and the ones other replicas stored, every HINT_POLL.
        The seconds until the next round."""
        if self.monotonic() >= self._due:
            self._due = self.monotonic() + self.interval
            try:
                with self.metrics.slurm_sync_step():
                    self.step()
            except Exception as exc:  # keep syncing whatever one step hit; health() says why
                log_failure(log, "Slurm sync step failed", exc)
        elif self.hinted is not None and not self._standby and self._last_ok is not None:
            try:
                if failures := self.apply_hints():
                    self._report(failures)
            except Exception as exc:
                log_failure(log, "applying Slurm job hints failed", exc)
        left = self._due - self.monotonic()
        return min(left, HINT_POLL) if self.hinted is not None else left

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        try:
            changed = self.listings.read(self._witnessed())
        except SlurmError as exc:
            self._error = f"Slurm unreachable: {exc.message}"
            self._doubted(self._error)
            # An outage is logged when it starts and ends (app.outages), not every step.
            log.log(
                logging.DEBUG if isinstance(exc, SlurmUnavailable) else logging.WARNING,
                "Slurm sync: %s",
                exc,
            )
            self.metrics.slurm_reached(False)
            self.listings_read = False
            return
        finally:
            self.state.publish()
        self.listings_read = self.listings.jobs_listed_at is not None
        self.pusher.keep_marker(self.state.jobs_on_marker())
        self.metrics.slurm_reached(True)
        leads = self.leadership is None or self.leadership.check()
        self.metrics.leader("slurm-sync", leads)
        if not leads:
            # A new leader starts with a full pass, comparing every node.
            self._standby, self._views_seen, self.contended = True, None, frozenset()
            self.reconciler.forget()
            self.metrics.slurm_drifted_nodes(0)  # the leader compares, not this replica
            self._ok()
            return
        self._standby = False
        try:
            self._lead(changed)
        finally:
            self.state.publish()

    def _witnessed(self) -> int | None:
        """slurmctld's start time, once the witness stands on it (app.slurm.witness): the
        grants are voided first when it changed or was in doubt. None without a witness."""
        if self.witness is None:
            return None
        generation = self.witness.generation
        started = self.client.started_at()
        if (why := self.witness.question(started)) is not None:
            generation = self.witness.doubt(why)
            self._void_grants(why)
        self.witness.confirm(started, generation)
        self._voided = self._voided and not self.witness.trusted()
        return started

    def _doubted(self, why: str) -> None:
        """Slurm unreachable: its counts may change unseen (a slurmctld restarting behind
        it), so the grants are void from now on, for every replica."""
        if self.witness is None:
            return
        self.witness.doubt(why)
        if not self._voided:
            self._void_grants(why)

    def _void_grants(self, why: str) -> None:
        """Every grant in the ledger to zero (app.slurm.push.void_grant): read from the
        database, not the snapshot, which may not show a grant just raised yet."""
        names = [v.name for v in self.ledger.list_nodes() if not v.headroom.granted.is_zero()]
        for name in names:
            self.pusher.void_grant(name)
        self._voided = True
        if names:
            log.info(
                "headroom grants of %d nodes void until Slurm confirms them: %s", len(names), why
            )

    def apply_hints(self) -> list[str]:
        """Apply the job hints now (app.slurm.hint_sync); failures, by node or job."""
        assert self.hinted is not None
        return self.hinted.apply()

    def _lead(self, changed: bool) -> None:
        """Step 2 and 3; ``changed``: a listing brought news."""
        self.abandoned.release()
        owed = self._push_owed() + self._settle_headroom()
        views = self.node_views.list_nodes()
        # The snapshot hands out the same views while no node changed: an idle step then
        # costs no pass over them (15,000 nodes: ~40 ms a step, 4% of a core).
        if self.register_nodes and (changed or views is not self._views_seen):
            self._views_seen = None  # until registered: a failure is tried again next step
            views = register_unknown(self.ledger, self.node_views, views, self.state.nodes())
        renamed = False
        if views is not self._views_seen:
            self._views_seen = views
            renamed = self.reconciler.track(views)
        self._steps += 1
        failures: list[str] = []
        if changed:
            failures += self.hold_sweep.sweep(self.state.jobs())
            failures += self.held_back.nudge(self.state.nodes(), self.state.held_back())
        if changed or renamed or not self._steps % FULL_PASS_EVERY:
            failures += self._pass(views)
        if not self._steps % FULL_PASS_EVERY:
            failures += self._hold_lost()
        if self.hinted is not None:
            failures += self.hinted.apply()
        self._report(owed + failures)

    def _pass(self, views: Sequence[NodeView]) -> list[str]:
        """Reconcile every node; failures, by node."""
        failures: list[str] = []
        drifted = 0
        hinted = self.monotonic()
        for view in views:
            try:
                drifted += self.reconciler.sync(view)
            except NodeledgerError as exc:
                failures.append(f"{view.name}: {exc}")
            if self.hinted is not None and self.monotonic() - hinted >= HINT_POLL:
                # A long pass (every node pushed after a slurmctld restart: minutes at
                # 15,000 nodes) must not hold hints up. Views it made stale cost at most a
                # push that finds the counts in place.
                failures += self.hinted.apply()
                hinted = self.monotonic()
        self.metrics.slurm_drifted_nodes(drifted)
        return failures

    def _hold_lost(self) -> list[str]:
        """Hold again what lost its hold job (app.slurm.hold_sweep); failures, by holder."""
        listed_at = self.listings.jobs_listed_at
        if listed_at is None:
            return []
        return self.hold_sweep.hold_lost(self.state.jobs(), listed_at)

    def _push_owed(self) -> list[str]:
        """Push the nodes whose last push failed (admitted while Slurm was unreachable, with
        ``fail_open``): Slurm did not change, so nothing else here would look at them."""
        return self._push_each(self.pusher.owed(), "retry")

    def _settle_headroom(self) -> list[str]:
        """Give Slurm back the headroom of nodes idle long enough, or where Slurm jobs wait
        for resources (app.core.headroom)."""
        contended = self.state.contended()
        # Before any give-back is pushed: an admission that sees it sees this too.
        self.contended = (
            frozenset(v.name for v in self.node_views.list_nodes() if v.slurm_name in contended)
            if contended
            else frozenset()
        )
        settled = self.ledger.settle_headroom(contended)
        return self._push_each(settled, "headroom settled")

    def _push_each(self, names: Iterable[str], reason: str) -> list[str]:
        """Push each node; failures, by node."""
        failures = []
        for name in names:
            try:
                self.pusher.push(name, reason=reason)
            except NodeledgerError as exc:
                failures.append(f"{name}: {exc}")
        return failures

    def _report(self, failures: list[str]) -> None:
        if failures:
            self._error = "sync failed for " + "; ".join(failures[:5])
        else:
            self._ok()

    def _ok(self) -> None:
        self._error = None
        self._last_ok = self.monotonic()
