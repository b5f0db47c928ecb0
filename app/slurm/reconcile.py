"""Reconcile one ledger node with its Slurm node: observe -> plan -> apply.

1. Observe: the ledger's view of the node and Slurm's node, jobs and unlisted allocation as
   the cache has them (app.slurm.state).
2. Plan: ``plan_node`` (app.core.plan), pure.
3. Apply, in the plan's order, through the ledger and the pusher: the health reason; the
   Slurm-job holdings (one snapshot-replace, so the event log says which jobs came and
   went); the push of the counts, whose read-back becomes the cache's node, and the drift
   event when the push found Slurm had lost the counts it was given.

A node whose inputs are the very objects its last compare found in place is skipped: each
is immutable or replaced whole when it changes, so the plan would be the same (a pass over
15,000 nodes that changed nothing: ~1 s of CPU saved, every full pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from app.core.plan import NodePlan, Push, plan_node
from app.core.records import HolderKind, NodeView
from app.ledger import events
from app.ledger.service import Ledger
from app.metrics.registry import NO_METRICS, Metrics
from app.slurm.client import SlurmClient
from app.slurm.push import Pusher
from app.slurm.state import Observed, SlurmState


class NodeReconciler:
    def __init__(
        self,
        client: SlurmClient,
        ledger: Ledger,
        pusher: Pusher,
        state: SlurmState,
        *,
        metrics: Metrics = NO_METRICS,
        listed_at: Callable[[], datetime | None] = lambda: None,
    ) -> None:
        """``listed_at``: when the jobs' last full listing began, in the ledger's clock
        (app.core.plan defers jobs that would overcommit a node beside a newer holding)."""
        self.listed_at = listed_at
        self.client = client
        self.ledger = ledger
        self.pusher = pusher
        self.state = state
        self.metrics = metrics
        self._names: dict[str, list[str]] = {}  # Slurm node -> ledger nodes mapped to it
        self._ledger_key: tuple[tuple[str, str], ...] = ()  # (name, Slurm name) of each node
        # Per ledger node: what its last compare depended on, when it found all in place.
        self._in_place: dict[str, tuple[object, ...]] = {}

    def track(self, views: Sequence[NodeView]) -> bool:
        """Map Slurm nodes to the ledger nodes ``views`` name; whether the mapping changed."""
        key = tuple(sorted((v.name, v.slurm_name) for v in views))
        if key == self._ledger_key:
            return False
        self._ledger_key, self._names = key, {}
        for v in views:
            self._names.setdefault(v.slurm_name, []).append(v.name)
        return True

    def forget(self) -> None:
        """Compare every node afresh from now on (a new leader starts with a full pass)."""
        self._ledger_key, self._in_place = (), {}

    def sync_slurm_node(self, slurm_name: str, read_at: float) -> None:
        """Sync the ledger nodes mapped to one Slurm node, read afresh from ``read_at`` on
        (monotonic: a listing begun before keeps this read's states)."""
        names = self._names.get(slurm_name)
        if not names:
            return
        self.state.remember(self.client.get_node(slurm_name), read_at=read_at)
        for view in self.ledger.views_named(names):
            self.sync(view)

    def sync(self, view: NodeView) -> bool:
        """Whether Slurm's counts differed from what the ledger withholds."""
        observed = self.state.observe(view.slurm_name)
        inputs = (view, observed.node, observed.jobs, observed.unlisted)
        last = self._in_place.pop(view.name, None)
        if last is not None and all(a is b for a, b in zip(last, inputs, strict=True)):
            self._in_place[view.name] = last
            return False
        listed_at = self.listed_at()
        plan = self._plan(view, observed, listed_at)
        settled = plan.settled
        if plan.health is not None:
            view = self.ledger.set_health(view.name, plan.health.reason)
            plan = self._plan(view, observed, listed_at)  # as written
        if plan.holdings is not None:
            self.ledger.replace_holdings(
                view.name,
                HolderKind.SLURM_JOB,
                plan.holdings,
            )
        if settled and observed.node is not None:
            self._in_place[view.name] = inputs
        if plan.push is not None:
            self._push(view, plan.push, observed)
        return plan.push is not None

    def _push(self, view: NodeView, push: Push, observed: Observed) -> None:
        result = self.pusher.push(
            view.name, reason="drift", observed=observed.node, observed_jobs=observed.jobs.values()
        )
        # Else every later pass would see the listing's old counts and push again: at
        # 15,000 nodes, a read per node per pass, while hints wait.
        self.state.remember(result.node)
        if result.updated and result.drifted:
            self.metrics.slurm_drift_corrected()
            now, gres = self.ledger.clock(), result.node.gres
            self.ledger.append_event(events.slurm_drift(now, view.name, push.slurm_name, gres))

    def _plan(self, view: NodeView, observed: Observed, listed_at: datetime | None) -> NodePlan:
        return plan_node(
            view,
            observed.node,
            observed.jobs.values(),
            observed.unlisted,
            listed_at=listed_at,
            hold_user=self.client.user_name,
            marked=self.pusher.marked,
        )
