"""GenericNode status mirrors the ledger: on every change, batched and rate-limited.

Changes come from the node snapshot (app.ledger.snapshot, the one follower of the
ledger's event log, so changes made by any replica count): while the mirror runs it
subscribes to the names of changed nodes, collects them as a set of dirty nodes, and
writes them, reading their views from the snapshot, at most ``qps`` per second with a
``burst`` (1,000 nodes changing at once cost 1,000 / qps seconds, not a flood).

A node is written only when its figures differ from what its GenericNode has. What each
GenericNode has is known from the mirror's own writes and, every ``resync_period``, from a
paginated LIST of the GenericNodes (in case someone else changed them), compared with
every node's view in the snapshot: the resync then writes
exactly the nodes that differ, none when nothing changed, within the same rate.
Each condition keeps its lastTransitionTime until its status changes; lastSyncTime says
when the figures were last written. Per node only a compact fingerprint of the mirrored
fields is kept (app.core.genericnode.fingerprint).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any, TypedDict

from app.core.components import Health
from app.core.genericnode import MANAGED_BY, fingerprint, status_of
from app.core.rate import TokenBucket
from app.core.records import NodeView
from app.kube.client import GENERICNODES, KubeClient, KubeError
from app.kube.controllers.dirty import DirtyNames, write_at_rate
from app.ledger.service import Clock
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import NO_METRICS, Metrics
from app.outages import log_failure

log = logging.getLogger(__name__)
POLL = 0.2  # seconds between looks at the snapshot (its refresh reads the event log)


class _Meta(TypedDict, total=False):
    name: str


class _Status(TypedDict, total=False):
    capacity: Any
    allocatedResources: Any
    free: Any
    headroom: Any
    gpus: Any
    conditions: Any


class _StatusShape(TypedDict, total=False):
    """What the resync reads of a GenericNode: its name and the mirrored fields."""

    metadata: _Meta
    status: _Status


class StatusMirror:
    def __init__(
        self,
        snapshot: NodeSnapshot,
        client: KubeClient,
        slurm_health: Callable[[], Health | None],
        *,
        qps: float,
        burst: int,
        resync_period: float,
        gpu_resource: str,
        clock: Clock,
        metrics: Metrics = NO_METRICS,
        tainted: Callable[[str], Mapping[int, tuple[str, str]]] = lambda _node: {},
    ) -> None:
        """``tainted``: a node's devices the GPU device taints taint for Slurm jobs (index ->
        job id, rule), listed in status.gpus."""
        self.snapshot = snapshot
        self.tainted = tainted
        self.client = client
        self.slurm_health = slurm_health
        self.bucket = TokenBucket(qps, burst)
        self.resync_period = resync_period
        self.gpu_resource = gpu_resource
        self.clock = clock
        self.metrics = metrics
        self.written: dict[str, str] = {}  # node -> fingerprint of its GenericNode's status
        self._dirty = DirtyNames()
        self._slurm_ok: bool | None = None

    def run(self, stop: threading.Event) -> None:
        # Subscribed first: any change after the resync's read of the snapshot is marked.
        unsubscribe = self.snapshot.subscribe(self._mark)
        try:
            resynced: float | None = None
            while not stop.is_set():
                try:
                    self._follow()
                    if resynced is None or time.monotonic() - resynced > self.resync_period:
                        self.resync()
                        resynced = time.monotonic()
                    self.flush(stop)
                except Exception as exc:  # keep mirroring; the node stays marked
                    log_failure(log, "GenericNode status mirror", exc)
                stop.wait(POLL)
        finally:
            unsubscribe()

    def _mark(self, names: Collection[str]) -> None:
        self._dirty.add(names)

    def mark(self, names: Collection[str]) -> None:
        """Write these nodes' status again if it changed (their device taints did)."""
        self._mark(names)

    def resync(self) -> None:
        """Read every GenericNode's status from Kubernetes and mark the nodes whose
        figures differ from the ledger's (the next flush writes them)."""
        started = time.monotonic()
        selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
        listed, _ = self.client.list(
            GENERICNODES, _status_fingerprint, _StatusShape, labelSelector=selector
        )
        self.written = dict(listed)
        health, now = self.slurm_health(), self.clock()
        differ: list[str] = []
        for view in self.snapshot.list_nodes():
            known = self.written.get(view.name)
            if known is not None and self._desired(view, health, now)[1] != known:
                differ.append(view.name)
        self._mark(differ)
        log.info(
            "GenericNode status resync: %d of %d differ from the ledger (%.2f s)",
            len(differ), len(listed), time.monotonic() - started,
        )  # fmt: skip

    def _follow(self) -> None:
        """Bring the snapshot up to date (its subscribers, this one too, hear of the
        changes), and mark every node when Slurm's health flips."""
        views = self.snapshot.views(max_age=POLL)
        health = self.slurm_health()
        ok = None if health is None else health.status == "ok"
        if ok != self._slurm_ok:  # SlurmSynced changes on every node
            self._slurm_ok = ok
            self._mark(list(views))

    def flush(self, stop: threading.Event) -> None:
        write_at_rate(self._dirty, self.bucket, self.write, stop)

    def write(self, name: str) -> bool:
        """Write the node's status if it differs from its GenericNode's; whether it did."""
        view = self.snapshot.views().get(name)
        if view is None:
            return False
        status, mark = self._desired(view, self.slurm_health(), self.clock())
        if self.written.get(name) == mark:
            return False
        try:
            self.client.patch_status(f"{GENERICNODES}/{name}", status)
        except KubeError as exc:
            if exc.status == 404:
                return False  # discovery creates it; the next change or resync writes it
            raise
        self.written[name] = mark
        self.metrics.kube_status_written()
        return True

    def _desired(
        self, view: NodeView, health: Health | None, now: datetime
    ) -> tuple[dict[str, Any], str]:
        """The status to have, with its fingerprint; conditions keep the transition times
        of the status Kubernetes has."""
        known = self.written.get(view.name)
        previous = json.loads(known) if known else {}
        tainted = self.tainted(view.name)
        status = status_of(view, health, previous, now, self.gpu_resource, tainted)
        return status, fingerprint(status)


def _status_fingerprint(obj: dict[str, Any]) -> tuple[str, str]:
    return str(obj["metadata"]["name"]), fingerprint(obj.get("status") or {})
