"""List, then watch from the list's resourceVersion, forever.

The list is read in pages (KubeClient.list) and is one consistent snapshot; the watch
starts from that snapshot's resourceVersion, so an object created after the list arrives
as an event and none is seen twice. Bookmarks advance the resourceVersion without events;
an expired resourceVersion (410 Gone) or any failure means list again, and the handler's
``resync`` converges to the listed truth, so nothing is lost or counted twice across
watch restarts. The loop is a thin shell: the handler decides.

Every ``resync_period`` the handler resyncs again, from the objects as the list and the
watch's events since have left them (one decoded record per object, by the handler's
``key``), not from a new LIST: the way client-go's informers resync. At 150,000 pods a LIST
costs the API server and this process seconds each (bench/kube_scale.py), and a periodic
one from every replica is load a large cluster should not carry; a watch that breaks off
or expires lists again anyway.

Objects are passed through the handler's ``decode`` as they arrive (page by page, event by
event): what a handler keeps is its own compact record, never the API's object dicts.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generic, Protocol, TypeVar

from app.kube.client import KubeClient, KubeError
from app.loops import Stop
from app.metrics.registry import NO_METRICS, Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")


class WatchHandler(Protocol[T]):
    @property
    def shape(self) -> Any:
        """The fields ``decode`` reads, as a TypedDict (listed pages are parsed into just
        those), or None for whole objects."""

    def decode(self, obj: dict[str, Any]) -> T:
        """The part of an API object the handler keeps (called for every listed object and
        every event's object)."""

    def key(self, item: T) -> str:
        """The object's identity among the watched ones (uid, or name if cluster-scoped)."""

    def resync(self, items: list[T]) -> None:
        """The complete current set of objects."""

    def on_event(self, kind: str, item: T) -> None:
        """ADDED, MODIFIED or DELETED."""


MAX_BACKOFF = 5.0  # seconds between attempts while the API server does not answer


class Expired(Exception):
    pass


class ListWatch(Generic[T]):
    def __init__(
        self,
        name: str,
        client: KubeClient,
        path: str,
        handler: WatchHandler[T],
        *,
        resync_period: float = 300.0,
        watch_timeout: int = 30,
        metrics: Metrics = NO_METRICS,
        **query: str,
    ) -> None:
        self.name = name
        self.client = client
        self.path = path
        self.handler = handler
        self.resync_period = resync_period
        self.watch_timeout = watch_timeout
        self.query = {k: v for k, v in query.items() if v}
        self.synced = threading.Event()
        self.error: str | None = None
        self.metrics = metrics
        self._listed = False
        metrics.kube_watch(name)

    def run(self, stop: Stop) -> None:
        backoff = 0.5
        while not stop.is_set():
            try:
                self._list_and_watch(stop)
                backoff = 0.5
            except Expired:
                self.metrics.kube_watch_restarted(self.name)
                log.info("%s: resourceVersion expired, listing again", self.name)
            except Exception as exc:  # keep watching whatever happened; health says why
                self.metrics.kube_watch_restarted(self.name)
                if isinstance(exc, KubeError) and exc.status == 410:
                    log.info("%s: resourceVersion expired, listing again", self.name)
                    continue
                self.error = f"{self.name}: {exc}"
                # The API server's outage is logged when it starts and ends (app.outages).
                away = self.client.availability.down
                level = logging.DEBUG if away else logging.WARNING
                log.log(level, "%s: %s; retrying in %.1fs", self.name, exc, backoff)
                stop.wait(backoff)
                # Capped low: a few watches per replica cost the API server nothing, and
                # a watch must resume within seconds of the API server's return.
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _list_and_watch(self, stop: Stop) -> None:
        if self._listed:
            self.metrics.kube_relisted(self.name)
        self._listed = True
        started = time.monotonic()
        handler = self.handler
        items, version = self.client.list(self.path, handler.decode, handler.shape, **self.query)
        if stop.is_set():
            return  # leadership was lost while listing: another replica acts on it now
        listed = time.monotonic()
        key = handler.key
        known = {key(item): item for item in items}  # kept current by the events below
        del items
        handler.resync(list(known.values()))
        self.synced.set()
        self.error = None
        resynced = time.monotonic()
        # What a resync costs at scale (bench/kube_scale.py reads these lines).
        log.info(
            "%s: listed %d in %.2f s, resync %.2f s",
            self.name, len(known), listed - started, resynced - listed,
        )  # fmt: skip
        while not stop.is_set():
            if time.monotonic() - resynced >= self.resync_period:
                started = time.monotonic()
                handler.resync(list(known.values()))
                resynced = time.monotonic()
                log.info(
                    "%s: resync of %d from the watch, %.2f s",
                    self.name, len(known), resynced - started,
                )  # fmt: skip
            events = self.client.watch(
                self.path, version, self.watch_timeout, stop=stop, **self.query
            )
            for event in events:
                if stop.is_set():
                    return
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired
                    raise KubeError(f"watch error: {obj.get('message')}", obj.get("code"))
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    item = handler.decode(obj)
                    if kind == "DELETED":
                        known.pop(key(item), None)
                    else:
                        known[key(item)] = item
                    handler.on_event(kind, item)
