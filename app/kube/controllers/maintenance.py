"""One maintenance on both sides of a co-managed node (app.core.maintenance decides):
Slurm's drains, downs and failures become the Node's taint, and a cordoned Node drains its
Slurm node (through ``DrainPort``, which app.slurm.drains implements).

Leader-only, like the status mirror: it follows the node snapshot (health is a ledger
field the Slurm sync writes, so what any replica's sync saw counts) and discovery's Node
watch (a cordon), and reconciles each node that changed. A taint is patched after a read of
the Node, conditionally on its resourceVersion (a Node changed meanwhile is read again next
pass; no one else's taint is lost). Every ``resync_period`` one paginated list of the
managed Nodes finds taints someone removed or added by hand under our key, and nodes gone
from the ledger. A call that fails (either side unreachable) is retried on the next
pass, nothing guessed meanwhile.

Turned off (``slurm_taints=False``), it still runs and removes its own taints: a taint the
service would not lift any more must not outlive the setting.

After each pass it looks at the nodes it was told of (app.core.disagreement): how many
co-managed nodes one side keeps out and the other not, and since when, as metrics; the
chart's alert fires on one that lasts (docs/operations.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any, Protocol

from app.core.disagreement import Disagreements, disagree
from app.core.maintenance import (
    TAINT_KEY,
    SlurmAction,
    SlurmTaint,
    carried,
    cordon_reason,
    node_patch,
    slurm_action,
    slurm_taint,
)
from app.core.plan import slurm_lists
from app.core.records import EventKind
from app.kube.client import KubeClient, KubeError
from app.kube.controllers.dirty import DirtyNames
from app.ledger.service import Clock
from app.ledger.snapshot import NodeSnapshot, Views
from app.loops import Loop, Stop
from app.metrics.registry import NO_METRICS, Metrics

log = logging.getLogger(__name__)
POLL = 0.5  # seconds between looks at the snapshot
Record = Callable[[EventKind, str, str, dict[str, Any]], None]


class DrainPort(Protocol):
    """The Slurm side of a cordon (app.slurm.drains): each reads the node first and acts
    only on a state that allows it; whether it acted."""

    def drain(self, node: str, reason: str) -> bool: ...

    def resume(self, node: str) -> bool: ...


class Maintenance:
    def __init__(
        self,
        snapshot: NodeSnapshot,
        client: KubeClient,
        managed: Callable[[str], bool],
        cordoned: Callable[[str], bool],
        drains: DrainPort | None,
        clock: Clock,
        record: Record,
        *,
        slurm_taints: bool,
        evict: bool,
        node_selector: str,
        resync_period: float,
        co_managed: bool = True,
        metrics: Metrics = NO_METRICS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``managed``: the Nodes discovery put in the ledger (others are never touched);
        ``cordoned``: whether a Node is (discovery's watch); ``drains``: the Slurm side of a
        cordon (None: cordons are not relayed, e.g. Slurm off); ``record``: appends a
        ledger event (``Ledger.record_event``), one per transition relayed;
        ``co_managed``: Slurm is integrated (False: no node has two sides to disagree)."""
        self.snapshot = snapshot
        self.client = client
        self.managed = managed
        self.cordoned = cordoned
        self.drains = drains
        self.clock = clock
        self.record = record
        self.enabled = slurm_taints
        self.evict = evict
        self.node_selector = node_selector
        self.resync_period = resync_period
        self.co_managed = co_managed
        self.metrics = metrics
        self.monotonic = monotonic
        self.asked: dict[str, SlurmAction] = {}  # per node: what Slurm was last asked to do
        self.seen: dict[str, bool] = {}  # per node: its cordon as last relayed
        # What each Node carries of ours, as last written or listed: a node whose wanted
        # taint equals it costs nothing.
        self.carried: dict[str, SlurmTaint | None] = {}
        self._dirty = DirtyNames()
        self.disagreements = Disagreements()
        self._unlooked = DirtyNames()  # marked or reconciled since the last look
        self._resynced: float | None = None
        self._loop = Loop(
            "maintenance", self.step, interval=POLL, logger=log, what="node maintenance"
        )

    def run(self, stop: Stop) -> None:
        """Reconcile until ``stop`` (the leadership term's): at each change, and at least
        every ``POLL`` seconds (the snapshot's refresh marks what changed)."""
        unsubscribe = self.snapshot.subscribe(self.mark)
        try:
            self._loop.run(stop)
        finally:
            unsubscribe()
            self.disagreements.clear()  # the next leader counts
            self.metrics.maintenance_disagreements(0, 0.0)

    def step(self) -> None:
        now = self.monotonic()
        try:
            if self._resynced is None or now - self._resynced > self.resync_period:
                self.resync()
                self._resynced = now
            self.flush()
        finally:
            # Also when a call failed: a disagreement an outage leaves open counts.
            self.look(self.snapshot.views(max_age=POLL), self._unlooked.take(), now)

    def wanted(self, views: Views, name: str) -> SlurmTaint | None:
        view = views.get(name)
        if not self.enabled or view is None:
            return None
        return slurm_taint(view.health_reason, evict=self.evict)

    def resync(self) -> None:
        """List the managed Nodes; mark every one whose taint of ours is not the wanted one."""
        listed, _ = self.client.list(
            "/api/v1/nodes", _name_and_taint, labelSelector=self.node_selector
        )
        views = self.snapshot.views(max_age=POLL)
        self.carried = dict(listed)
        self.mark([name for name, taint in listed if taint != self.wanted(views, name)])
        self.disagreements.keep(self.carried)
        self._unlooked.add(self.carried)

    def flush(self) -> None:
        """Reconcile every node marked since the last pass (the snapshot's refresh marks
        the nodes that changed); a node that fails is marked again."""
        views = self.snapshot.views(max_age=POLL)  # its refresh marks changed nodes
        names = self._dirty.take()
        again: list[str] = []
        try:
            for name in names:
                ours = self.managed(name) or self.carried.get(name) is not None
                if ours and not self.reconcile(name, self.wanted(views, name)):
                    again.append(name)
                if self.drains is not None and self.managed(name):
                    self.relay_cordon(views, name, self.drains)
        except Exception:
            self.mark(names)  # none is lost: the next pass goes over them again
            raise
        finally:
            self._unlooked.add(names)
        self.mark(again)

    def reconcile(self, name: str, wanted: SlurmTaint | None) -> bool:
        """Bring one Node's taint of ours to ``wanted``; False when the Node changed
        meanwhile (409: read again on the next pass)."""
        if name in self.carried and self.carried[name] == wanted:
            return True
        try:
            node = self.client.request("GET", f"/api/v1/nodes/{name}")
            patch = node_patch(node, wanted)
            if patch is not None:
                version = str(node["metadata"].get("resourceVersion", ""))
                self.client.request(
                    "PATCH",
                    f"/api/v1/nodes/{name}",
                    body=patch.body(version),
                    content_type="application/merge-patch+json",
                )
                message = (
                    f"Node tainted {TAINT_KEY}={wanted.value}:{wanted.effect}: {wanted.reason}"
                    if wanted is not None
                    else f"Node's {TAINT_KEY} taint lifted: Slurm returned the node"
                )
                log.info("%s: %s", name, message)
                self.record(EventKind.MAINTENANCE, name, message, {"side": "kubernetes"})
        except KubeError as exc:
            if exc.status == 404:  # no such Node: nothing to carry
                self.carried.pop(name, None)
                return True
            if exc.status == 409:
                return False
            raise
        self.carried[name] = wanted
        return True

    def relay_cordon(self, views: Views, name: str, drains: DrainPort) -> None:
        """Drain the Slurm node of a cordoned Node, resume it at the uncordon (the port
        checks Slurm's state first); each once, until the ledger's view of Slurm changes."""
        view = views.get(name)
        if view is None or not slurm_lists(view.health_reason):
            return  # no Slurm node to drain or resume (a failing call would stall every pass)
        cordoned = self.cordoned(name)
        before, self.seen[name] = self.seen.get(name), cordoned
        action = slurm_action(cordoned, view.health_reason)
        if action is None:
            self.asked.pop(name, None)
            if before is not None and before != cordoned and view.health_reason is not None:
                # A cordon or uncordon that Slurm's state makes a no-op: say why.
                what = "cordoned" if cordoned else "uncordoned"
                message = (
                    f"Slurm node {view.slurm_name} left as it is: the Node was {what}, "
                    f"and {view.health_reason}"
                )
                self.record(EventKind.MAINTENANCE, name, message, {"side": "slurm"})
            return
        if self.asked.get(name) is action:
            return  # asked already: the sync has not seen Slurm's answer yet
        slurm = view.slurm_name
        if action is SlurmAction.DRAIN:
            reason = cordon_reason(self.clock())
            done = drains.drain(slurm, reason)
            message = (
                f"Slurm node {slurm} drained: {reason}"
                if done
                else f"Slurm node {slurm} left as it is: the Node was cordoned, and it is "
                "drained already"
            )
        else:
            done = drains.resume(slurm)
            message = (
                f"Slurm node {slurm} resumed: the Node was uncordoned"
                if done
                else f"Slurm node {slurm} left drained: the Node was uncordoned, but the "
                "drain is not nodeledger's any more"
            )
        self.record(EventKind.MAINTENANCE, name, message, {"side": "slurm", "action": action})
        self.asked[name] = action

    def look(self, views: Views, names: Collection[str], now: float) -> None:
        """Whether each of these nodes' two sides disagree (as last read or written), and
        the metrics of all that do."""
        for name in names:
            view = views.get(name)
            co_managed = (
                self.co_managed
                and view is not None
                and self.managed(name)
                and slurm_lists(view.health_reason)
            )
            disagreeing = co_managed and disagree(
                self.cordoned(name),
                self.carried.get(name),
                view.health_reason if view is not None else None,
            )
            self.disagreements.look(name, disagreeing, now)
        self.metrics.maintenance_disagreements(
            self.disagreements.count(), self.disagreements.oldest(now)
        )

    def mark(self, names: Collection[str]) -> None:
        """Reconcile these nodes on the next pass (the snapshot: they changed; discovery:
        their cordon did)."""
        self._dirty.add(names)
        self._unlooked.add(names)
        if names:
            self._loop.wake()


def _name_and_taint(node: dict[str, Any]) -> tuple[str, SlurmTaint | None]:
    return str(node["metadata"]["name"]), carried(node)
