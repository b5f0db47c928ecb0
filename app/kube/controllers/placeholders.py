"""Placeholder pods: what the ledger keeps from pods on each node beyond the pods
themselves (Slurm's jobs, manual holdings, the cap), as one pod per node that
kube-scheduler counts like any other (app.core.placeholder). Leader-only.

Like the status mirror (app.kube.controllers.mirror): subscribed to the snapshot's changed
nodes, it writes each node whose placeholder differs from what it should be, at most
``qps`` per second with a ``burst``: a create when a node first needs one, an in-place
resize (the pod's ``resize`` subresource, GA in Kubernetes 1.35) when its size changes, a
delete when it needs none. What exists is known from a list-watch of the placeholders
themselves, so one deleted by someone, evicted by `kubectl drain` or failed on its kubelet
is made again at once, not at the next resync.

A create or resize the API server refuses (Pod Security, a LimitRange, a ResourceQuota, an
admission policy) is tried again with a backoff; a node whose placeholder is still refused
``REFUSED_BOUND`` seconds after the first refusal is labelled ``placeholder.REFUSED_LABEL``,
which the chart's scheduler's node affinity keeps pods off (its free room there is not the
ledger's), and is counted in /readyz and a metric until a write goes through.
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
from app.kube.controllers.discovery import NodeRef
from app.ledger.snapshot import NodeSnapshot
from app.metrics.registry import NO_METRICS, Metrics
from app.outages import log_failure

log = logging.getLogger(__name__)
POLL = 0.2  # seconds between looks at the snapshot
# Seconds before a node whose placeholder failed gets a new one: its kubelet refused it
# (its pods then asked more than the ledger knew of yet), and asking again at once would
# loop at the write rate.
RETRY_FAILED = 10.0
# Seconds a node's placeholder may stay refused before the node is kept from the chart's
# scheduler; a refused write is tried again after RETRY_REFUSED, doubling up to
# RETRY_REFUSED_MAX (a namespace that refuses every placeholder must not take the whole
# write rate from the nodes that work).
REFUSED_BOUND = 10.0
RETRY_REFUSED = 1.0
RETRY_REFUSED_MAX = 60.0

# A managed Node by name; None: no such Node.
NodeLookup = Callable[[str], NodeRef | None]


class Placeholder(NamedTuple):
    """A placeholder pod as the watch last saw it (or as this controller just wrote it)."""

    name: str
    node: str
    requests: Resources
    terminal: bool = False


class Refusal(NamedTuple):
    """A node's placeholder writes the API server refused, since the first of them."""

    since: float  # monotonic
    retry_at: float
    tries: int
    reason: str


def refused_write(exc: KubeError) -> bool:
    """The API server answered and refused (a policy, a quota, an invalid resize): not an
    outage nor a throttle, which the next pass simply retries."""
    return exc.status is not None and 400 <= exc.status < 500 and exc.status != 429


class Placeholders:
    def __init__(
        self,
        snapshot: NodeSnapshot,
        client: KubeClient,
        node_ref: NodeLookup,
        caps: KubeCaps | None,
        *,
        namespace: str,
        image: str,
        priority_class: str = "",
        qps: float,
        burst: int,
        metrics: Metrics = NO_METRICS,
        monotonic: Callable[[], float] = time.monotonic,
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
        self.monotonic = monotonic
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self._lock = threading.Lock()  # _have: the watch's thread and this one's
        self._have: dict[str, Placeholder] = {}  # node -> its placeholder
        self._failed: dict[str, float] = {}  # node -> when it may have a new one (monotonic)
        self._refused: dict[str, Refusal] = {}  # node -> its placeholder's refused writes
        self._labelled: set[str] = set()  # Nodes carrying REFUSED_LABEL, as last written
        self._dirty = DirtyNames()
        # What /readyz says while some node is labelled (None: none is); the writer's
        # thread sets it after each pass.
        self.refusals: str | None = None

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
            labelled: list[str] | None = None
            while not stop.is_set():
                try:
                    self.snapshot.views(max_age=POLL)  # subscribers hear of the changes
                    self._retry_failed()
                    self.flush(stop)
                    if labelled is None:  # those a former leader labelled, once a term
                        labelled = self.find_labelled()
                except Exception as exc:  # keep going; the node stays marked
                    log_failure(log, "placeholder pods", exc)
                self._publish()
                stop.wait(POLL)
        finally:
            unsubscribe()
            self.refusals = None  # the next leader counts
            self.metrics.kube_placeholders_refused(0)

    def find_labelled(self) -> list[str]:
        """The Nodes labelled REFUSED_LABEL; each is marked, to be kept only while refused."""
        names, _ = self.client.list("/api/v1/nodes", _node_name, labelSelector=REFUSED)
        self._labelled.update(names)
        self.mark(names)
        return names

    def mark(self, names: Collection[str]) -> None:
        self._dirty.add(names)

    def _retry_failed(self) -> None:
        now = self.monotonic()
        due = [node for node, at in self._failed.items() if at <= now]
        for node in due:
            del self._failed[node]
        self.mark(due)
        # Refused ones: to try again, or to label once the bound has passed.
        self.mark([
            node for node, r in self._refused.items()
            if r.retry_at <= now or self._over_bound(r, now) != (node in self._labelled)
        ])  # fmt: skip

    def _over_bound(self, refusal: Refusal | None, now: float) -> bool:
        return refusal is not None and now - refusal.since >= REFUSED_BOUND

    def _publish(self) -> None:
        labelled = sorted(self._labelled)
        self.metrics.kube_placeholders_refused(len(labelled))
        if not labelled:
            self.refusals = None
            return
        first = self._refused.get(labelled[0])
        why = f" ({labelled[0]}: {first.reason})" if first is not None else ""
        self.refusals = (
            f"placeholder pods refused by the API server on {len(labelled)} node(s) for "
            f"{REFUSED_BOUND:.0f} s or more, kept from the chart's scheduler{why}"
        )

    def flush(self, stop: threading.Event) -> None:
        write_at_rate(self._dirty, self.bucket, self.write, stop)

    def desired(self, node: str, ref: NodeRef | None) -> Resources:
        """The node's placeholder size, its Node being ``ref`` (None: no such Node)."""
        view = self.snapshot.views().get(node)
        if view is None or ref is None:
            return Resources.ZERO
        return placeholder.size(view, ref.allocatable, self.caps)

    def write(self, node: str) -> bool:
        """Bring the node's placeholder to what it should be, and its Node's label to
        whether it is refused; whether an API call was made (an unchanged node costs no
        token)."""
        wrote = self._write_pod(node)
        return self._write_label(node) or wrote

    def _write_pod(self, node: str) -> bool:
        with self._lock:
            have = self._have.get(node)
        ref = self.node_ref(node)
        want = self.desired(node, ref)
        if want.is_zero() or node in self._failed:
            self._refused.pop(node, None)  # none is needed, or a failed one waits its turn
        name = placeholder.pod_name(node)
        if have is not None and (have.terminal or want.is_zero()):
            # A failed one does not count for the scheduler: gone, and a new one made
            # after RETRY_FAILED.
            if have.terminal:
                self._failed[node] = self.monotonic() + RETRY_FAILED
                log.warning("placeholder pod %s failed on its kubelet; a new one in %.0f s",
                            name, RETRY_FAILED)  # fmt: skip
            self._delete(name)
            self._forget(node)
            return True
        if want.is_zero() or node in self._failed:
            return False
        if (refusal := self._refused.get(node)) is not None and refusal.retry_at > self.monotonic():
            return False
        try:
            return self._create_or_resize(node, have, want, ref)
        except KubeError as exc:
            if not refused_write(exc):
                raise
            self._refuse(node, exc)
            return True

    def _create_or_resize(
        self, node: str, have: Placeholder | None, want: Resources, ref: NodeRef | None
    ) -> bool:
        name = placeholder.pod_name(node)
        if have is None:
            uid = ref.uid if ref is not None else ""
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
                if exc.status != 404 and not refused_write(exc):
                    raise
                # Deleted meanwhile, or a resize refused (a change of QoS class when CPU or
                # memory crosses zero, a quota, one made by an older release of another
                # shape): made again at its size, on its DELETED event (a create refused
                # in turn counts as a refusal).
                self._delete(name)
                self._forget(node)
                return True
        else:
            self._refused.pop(node, None)  # right as it is (a resize went through meanwhile)
            return False
        with self._lock:
            self._have[node] = Placeholder(name, node, want)
        self._refused.pop(node, None)
        self.metrics.kube_placeholder_written()
        return True

    def _refuse(self, node: str, exc: KubeError) -> None:
        now = self.monotonic()
        before = self._refused.get(node)
        tries = 1 if before is None else before.tries + 1
        delay = min(RETRY_REFUSED * 2 ** (tries - 1), RETRY_REFUSED_MAX)
        self._refused[node] = Refusal(before.since if before else now, now + delay, tries,
                                      str(exc)[:300])  # fmt: skip
        if before is None:  # once a refusal, not once a try
            log.warning("placeholder pod %s refused, tried again in %.0f s (the node is kept "
                        "from the chart's scheduler after %.0f s): %s",
                        placeholder.pod_name(node), delay, REFUSED_BOUND, exc)  # fmt: skip

    def _write_label(self, node: str) -> bool:
        """Label the Node while its placeholder is refused beyond the bound; unlabel after."""
        want = self._over_bound(self._refused.get(node), self.monotonic())
        if want == (node in self._labelled):
            return False
        patch = {"metadata": {"labels": {placeholder.REFUSED_LABEL: "true"}}} if want else UNLABEL
        try:
            self.client.request("PATCH", f"/api/v1/nodes/{node}", body=patch,
                                content_type="application/merge-patch+json")  # fmt: skip
        except KubeError as exc:
            if exc.status != 404:
                raise
            want = False  # the Node is gone
        if want:
            self._labelled.add(node)
            log.warning("node %s kept from the chart's scheduler: its placeholder pod is "
                        "still refused after %.0f s", node, REFUSED_BOUND)  # fmt: skip
        else:
            self._labelled.discard(node)
            log.info("node %s back to the chart's scheduler: no placeholder refused", node)
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


REFUSED = f"{placeholder.REFUSED_LABEL}=true"
UNLABEL = {"metadata": {"labels": {placeholder.REFUSED_LABEL: None}}}


def _node_name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


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
    labelled, _ = client.list("/api/v1/nodes", _node_name, labelSelector=REFUSED)
    for node in labelled:  # no scheduler reads the label any more
        client.request("PATCH", f"/api/v1/nodes/{node}", body=UNLABEL,
                       content_type="application/merge-patch+json")  # fmt: skip
    return gone
