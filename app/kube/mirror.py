"""GenericNode status mirrors the ledger: on every change, batched and rate-limited.

Changes are found by following the ledger's event log (so changes made by any replica
count; app.ledger.follow catches events that commit out of id order), collected as a set
of dirty nodes, and written at most ``qps`` per second with a
``burst`` (1,000 nodes changing at once cost 1,000 / qps seconds, not a flood). A node
whose status did not change is not written; a periodic resync rewrites everything (in
case someone else changed it), keeping each condition's lastTransitionTime.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from app.components import Health
from app.kube.client import GENERICNODES, KubeClient, KubeError
from app.kube.genericnode import same_status, status_of
from app.ledger.errors import NodeNotFound
from app.ledger.follow import EventFollower
from app.ledger.service import Clock, Ledger
from app.ledger.snapshot import NodeViews

log = logging.getLogger(__name__)


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
        views: NodeViews | None = None,
    ) -> None:
        self.ledger = ledger
        self.node_views: NodeViews = views or ledger  # every node's name, at resyncs
        self.client = client
        self.slurm_health = slurm_health
        self.bucket = TokenBucket(qps, burst)
        self.resync_period = resync_period
        self.gpu_resource = gpu_resource
        self.clock = clock
        self.written: dict[str, dict[str, Any]] = {}
        self._dirty: set[str] = set()
        self._resyncing: set[str] = set()  # written even when unchanged
        self._events = EventFollower(ledger)
        self._slurm_ok: bool | None = None

    def run(self, stop: threading.Event) -> None:
        resynced = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() - resynced > self.resync_period:
                    self._resyncing = {v.name for v in self.node_views.list_nodes()}
                    self._dirty |= self._resyncing
                    resynced = time.monotonic()
                self._follow_events()
                self.flush(stop)
            except Exception:  # keep mirroring; the next pass retries
                log.exception("GenericNode status mirror")
            stop.wait(0.2)

    def _follow_events(self) -> None:
        self._dirty.update(e.node for e in self._events.poll() if e.node)
        health = self.slurm_health()
        ok = None if health is None else health.status == "ok"
        if ok != self._slurm_ok:  # SlurmSynced changes on every node
            self._slurm_ok = ok
            self._dirty.update(v.name for v in self.node_views.list_nodes())

    def flush(self, stop: threading.Event) -> None:
        while self._dirty and not stop.is_set():
            pause = self.bucket.wait_time()
            if pause:
                stop.wait(pause)
                continue
            self.write(self._dirty.pop())

    def write(self, name: str) -> None:
        try:
            view = self.ledger.get_node(name)
        except NodeNotFound:
            return
        previous = self.written.get(name, {})
        status = status_of(view, self.slurm_health(), previous, self.clock(), self.gpu_resource)
        if previous and same_status(previous, status) and name not in self._resyncing:
            return
        self._resyncing.discard(name)
        try:
            self.client.patch_status(f"{GENERICNODES}/{name}", status)
        except KubeError as exc:
            if exc.status == 404:
                return  # discovery creates it; the next change or resync writes it
            raise
        self.written[name] = status
