"""GenericNode status mirrors the ledger: on every change, batched and rate-limited.

Changes are found by following the ledger's event log (so changes made by any replica
count; app.ledger.follow catches events that commit out of id order), collected as a set
of dirty nodes, and written at most ``qps`` per second with a ``burst`` (1,000 nodes
changing at once cost 1,000 / qps seconds, not a flood).

A node is written only when its figures differ from what its GenericNode has. What each
GenericNode has is known from the mirror's own writes and, every ``resync_period``, from a
paginated LIST of the GenericNodes (in case someone else changed them), compared with
every node's totals (summed by the database, no holdings loaded): the resync then writes
exactly the nodes that differ, none when nothing changed, within the same rate.
Each condition keeps its lastTransitionTime until its status changes; lastSyncTime says
when the figures were last written. Per node only a compact fingerprint of the mirrored
fields is kept (app.kube.genericnode.fingerprint).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypedDict

from app.components import Health
from app.kube.client import GENERICNODES, KubeClient, KubeError
from app.kube.genericnode import MANAGED_BY, fingerprint, status_of
from app.ledger.errors import NodeNotFound
from app.ledger.follow import EventFollower
from app.ledger.records import NodeTotals, NodeView
from app.ledger.service import Clock, Ledger
from app.metrics.registry import NO_METRICS, Metrics
from app.outages import log_failure

log = logging.getLogger(__name__)


class _Meta(TypedDict, total=False):
    name: str


class _Status(TypedDict, total=False):
    capacity: Any
    allocatedResources: Any
    free: Any
    conditions: Any


class _StatusShape(TypedDict, total=False):
    """What the resync reads of a GenericNode: its name and the mirrored fields."""

    metadata: _Meta
    status: _Status


class TokenBucket:
    def __init__(
        self, rate: float, burst: int, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.monotonic = monotonic
        self.last = monotonic()

    def wait_time(self) -> float:
        """0 when a token was taken, else how long until one is available."""
        now = self.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class StatusMirror:
    def __init__(
        self,
        ledger: Ledger,
        client: KubeClient,
        slurm_health: Callable[[], Health | None],
        *,
        qps: float,
        burst: int,
        resync_period: float,
        gpu_resource: str,
        clock: Clock,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.ledger = ledger
        self.client = client
        self.slurm_health = slurm_health
        self.bucket = TokenBucket(qps, burst)
        self.resync_period = resync_period
        self.gpu_resource = gpu_resource
        self.clock = clock
        self.metrics = metrics
        self.written: dict[str, str] = {}  # node -> fingerprint of its GenericNode's status
        self._dirty: set[str] = set()
        self._events = EventFollower(ledger)
        self._slurm_ok: bool | None = None

    def run(self, stop: threading.Event) -> None:
        resynced: float | None = None
        while not stop.is_set():
            try:
                # Events first: the follower's first poll anchors at the log's end, so any
                # change after a resync's ledger read is also seen as an event.
                self._follow_events()
                if resynced is None or time.monotonic() - resynced > self.resync_period:
                    self.resync()
                    resynced = time.monotonic()
                self.flush(stop)
            except Exception as exc:  # keep mirroring; the next pass retries
                log_failure(log, "GenericNode status mirror", exc)
            stop.wait(0.2)

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
        differ = 0
        for view in self.ledger.node_totals():
            known = self.written.get(view.name)
            if known is not None and self._desired(view, health, now)[1] != known:
                self._dirty.add(view.name)
                differ += 1
        log.info(
            "GenericNode status resync: %d of %d differ from the ledger (%.2f s)",
            differ, len(listed), time.monotonic() - started,
        )  # fmt: skip

    def _follow_events(self) -> None:
        self._dirty.update(e.node for e in self._events.poll() if e.node)
        health = self.slurm_health()
        ok = None if health is None else health.status == "ok"
        if ok != self._slurm_ok:  # SlurmSynced changes on every node
            self._slurm_ok = ok
            self._dirty.update(self.ledger.node_specs())

    def flush(self, stop: threading.Event) -> None:
        while self._dirty and not stop.is_set():
            pause = self.bucket.wait_time()
            if pause:
                stop.wait(pause)
                continue
            while self._dirty and not self.write(self._dirty.pop()):
                pass  # an unchanged node costs no token

    def write(self, name: str) -> bool:
        """Write the node's status if it differs from its GenericNode's; whether it did."""
        try:
            view = self.ledger.get_node(name)
        except NodeNotFound:
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
        self, view: NodeView | NodeTotals, health: Health | None, now: datetime
    ) -> tuple[dict[str, Any], str]:
        """The status to have, with its fingerprint; conditions keep the transition times
        of the status Kubernetes has."""
        known = self.written.get(view.name)
        previous = json.loads(known) if known else {}
        status = status_of(view, health, previous, now, self.gpu_resource)
        return status, fingerprint(status)


def _status_fingerprint(obj: dict[str, Any]) -> tuple[str, str]:
    return str(obj["metadata"]["name"]), fingerprint(obj.get("status") or {})
