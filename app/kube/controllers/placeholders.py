"""Placeholder pods (issue 35): what the ledger keeps from pods on each node beyond the pods
themselves (Slurm's jobs, manual holdings, the cap), as one pod per node that
kube-scheduler counts like any other (app.core.placeholder). Leader-only.

Like the status mirror (app.kube.controllers.mirror): subscribed to the snapshot's changed
nodes, it writes each node whose placeholder differs from what it should be, at most
``qps`` per second with a ``burst``: a create when a node first needs one, an in-place
resize (the pod's ``resize`` subresource, GA in Kubernetes 1.35) when its size changes, a
delete when it needs none. What exists is known from a list-watch of the placeholders
themselves, so one deleted by someone, evicted by `kubectl drain` or failed on its kubelet
is made again at once, not at the next resync.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from app.core import placeholder
from app.core.caps import KubeCaps
from app.core.pods import TERMINAL_PHASES, PodShape, pod_info
from app.core.rate import TokenBucket
from app.core.resources import Resources
from app.kube.client import KubeClient, KubeError
from app.kube.controllers.dirty import DirtyNames, write_at_rate
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import NO_METRICS, Metrics
from app.outages import log_failure

log = logging.getLogger(__name__)
POLL = 0.2  # seconds between looks at the snapshot
# Seconds before a node whose placeholder failed gets a new one: its kubelet refused it
# (its pods then asked more than the ledger knew of yet), and asking again at once would
# loop at the write rate.
RETRY_FAILED = 10.0

# A managed Node's allocatable as kube-scheduler reads it, and its uid (the placeholder's
# owner); None: no such Node.
NodeRef = Callable[[str], tuple[Resources, str] | None]


class Placeholder(NamedTuple):
    """A placeholder pod as the watch last saw it (or as this controller just wrote it)."""

    name: str
    node: str
    requests: Resources
    terminal: bool = False


class Placeholders:
    def __init__(
        self,
        snapshot: NodeSnapshot,
        client: KubeClient,
        node_ref: NodeRef,
        caps: KubeCaps | None,
        *,
        namespace: str,
        image: str,
        priority_class: str = "",
        qps: float,
        burst: int,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.snapshot = snapshot
        self.client = client
        self.node_ref = node_ref
        self.caps = caps
        self.namespace = namespace
        self.image = image
        self.priority_class = priority_class
        self.bucket = TokenBucket(qps, burst)
        self.metrics = metrics
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self._lock = threading.Lock()  # _have: the watch's thread and this one's
        self._have: dict[str, Placeholder] = {}  # node -> its placeholder
        self._failed: dict[str, float] = {}  # node -> when it may have a new one (monotonic)
        self._dirty = DirtyNames()

    # WatchHandler[Placeholder], of the pods labelled placeholder.LABEL in the namespace
    shape = PodShape

    def decode(self, obj: dict[str, Any]) -> Placeholder:
        pod = pod_info(obj, "")
        return Placeholder(pod.name, pod.node or "", pod.requests, pod.phase in TERMINAL_PHASES)

    def key(self, item: Placeholder) -> str:
        return item.name

    def resync(self, items: list[Placeholder]) -> None:
        have = {p.node: p for p in items if p.name == placeholder.pod_name(p.node)}
        with self._lock:
            before, self._have = self._have, have
        self._dirty.add([*before, *have, *self.snapshot.views()])

    def on_event(self, kind: str, item: Placeholder) -> None:
        if item.name != placeholder.pod_name(item.node):
            return  # labelled by someone else: not one of this controller's
        with self._lock:
            if kind == "DELETED":
                self._have.pop(item.node, None)
            else:
                self._have[item.node] = item
        self._dirty.add([item.node])

    # the writer
    def run(self, stop: threading.Event) -> None:
        unsubscribe = self.snapshot.subscribe(self.mark)
        try:
            while not stop.is_set():
                try:
                    self.snapshot.views(max_age=POLL)  # subscribers hear of the changes
                    self._retry_failed()
                    self.flush(stop)
                except Exception as exc:  # keep going; the node stays marked
                    log_failure(log, "placeholder pods", exc)
                stop.wait(POLL)
        finally:
            unsubscribe()

    def mark(self, names: Collection[str]) -> None:
        self._dirty.add(names)

    def _retry_failed(self) -> None:
        now = time.monotonic()
        due = [node for node, at in self._failed.items() if at <= now]
        for node in due:
            del self._failed[node]
        self.mark(due)

    def flush(self, stop: threading.Event) -> None:
        write_at_rate(self._dirty, self.bucket, self.write, stop)

    def desired(self, node: str, ref: tuple[Resources, str] | None) -> Resources:
        """The node's placeholder size, its Node being ``ref`` (None: no such Node)."""
        view = self.snapshot.views().get(node)
        if view is None or ref is None:
            return Resources.ZERO
        return placeholder.size(view, ref[0], self.caps)

    def write(self, node: str) -> bool:
        """Bring the node's placeholder to what it should be; whether an API call was made
        (an unchanged node costs no token)."""
        with self._lock:
            have = self._have.get(node)
        ref = self.node_ref(node)
        want = self.desired(node, ref)
        name = placeholder.pod_name(node)
        if have is not None and (have.terminal or want.is_zero()):
            # A failed one no longer counts for the scheduler: gone, and a new one made
            # after RETRY_FAILED.
            if have.terminal:
                self._failed[node] = time.monotonic() + RETRY_FAILED
                log.warning("placeholder pod %s failed on its kubelet; a new one in %.0f s",
                            name, RETRY_FAILED)  # fmt: skip
            self._delete(name)
            self._forget(node)
            return True
        if want.is_zero() or node in self._failed:
            return False
        if have is None:
            uid = ref[1] if ref is not None else ""
            body = placeholder.pod(node, uid, want, namespace=self.namespace, image=self.image,
                                   priority_class=self.priority_class)  # fmt: skip
            try:
                self.client.request("POST", self.path, body=body)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                # The last one is still terminating: its DELETED event marks the node.
                return True
        elif have.requests != want:
            try:
                self.client.request(
                    "PATCH", f"{self.path}/{name}/resize", body=placeholder.resize(want),
                    content_type="application/strategic-merge-patch+json",
                )  # fmt: skip
            except KubeError as exc:
                if exc.status != 404:
                    raise
                # Deleted meanwhile, or an API server without the resize subresource
                # (before 1.33): made again at its size, on its DELETED event.
                self._delete(name)
                self._forget(node)
                return True
        else:
            return False
        with self._lock:
            self._have[node] = Placeholder(name, node, want)
        self.metrics.kube_placeholder_written()
        return True

    def _delete(self, name: str) -> None:
        try:
            self.client.request("DELETE", f"{self.path}/{name}", body={"gracePeriodSeconds": 0})
        except KubeError as exc:
            if exc.status != 404:
                raise
        self.metrics.kube_placeholder_written()

    def _forget(self, node: str) -> None:
        with self._lock:
            self._have.pop(node, None)


def remove_all(client: KubeClient, namespace: str) -> int:
    """Delete every placeholder pod in ``namespace``: with the feature off they would keep
    steering the scheduler by a share nothing updates. How many went."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    names, _ = client.list(path, lambda obj: str(obj["metadata"]["name"]),
                           labelSelector=f"{placeholder.LABEL}=true")  # fmt: skip
    gone = 0
    for name in names:
        try:
            client.request("DELETE", f"{path}/{name}", body={"gracePeriodSeconds": 0})
            gone += 1
        except KubeError as exc:
            if exc.status != 404:
                raise
    if gone:
        log.info("placeholder pods are off: deleted %d left from when they were on", gone)
    return gone
