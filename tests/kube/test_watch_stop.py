"""A watch ends as soon as its stop is set, against the real kube-apiserver: the read
blocked on a quiet stream is woken (its socket shut), not left to the next event or to the
server's timeout. This is what lets a lost leader term end its watches at once
(app.kube.controllers)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from app.kube.client import KubeClient
from app.kube.controllers.watch import ListWatch
from app.loops import Stop
from tests.support.kube_cluster import KubeCluster
from tests.support.watch import PODS, Seen

pytestmark = pytest.mark.kube
QUIET = 300  # the watch's server timeout: far longer than any stop may take
NOBODY = "nobody=here"  # a selector no pod matches: a quiet watch
PATIENCE = 20.0  # seconds a stop may take on a busy machine (it takes milliseconds)


class WatchedClient(KubeClient):
    """The real client, saying when a watch's response has arrived (the stream is open)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watching = threading.Event()

    def _call(self, method: str, path: str, query: dict[str, Any] | None, *args: Any) -> Any:
        response = super()._call(method, path, query, *args)
        if (query or {}).get("watch"):
            self.watching.set()
        return response


def test_setting_stop_ends_a_quiet_watch_at_once(kube_cluster: KubeCluster) -> None:
    client = WatchedClient(kube_cluster.kubeconfig)
    _, version = client.list(PODS, lambda o: o, labelSelector=NOBODY)
    stop = Stop()
    events: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def watch() -> None:
        try:
            events.extend(client.watch(PODS, version, QUIET, stop=stop, labelSelector=NOBODY))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert client.watching.wait(PATIENCE)
    started = time.monotonic()
    stop.set()
    thread.join(PATIENCE)
    assert not thread.is_alive(), "the watch did not end when stopped"
    assert time.monotonic() - started < PATIENCE
    assert errors == []  # the events just end
    assert [e for e in events if e.get("type") != "BOOKMARK"] == []
    # The client goes on working: the shut connection is not handed out again.
    assert client.list(PODS, lambda o: o, labelSelector=NOBODY)[0] == []


def test_a_list_watch_stops_at_once_while_its_watch_waits(kube_cluster: KubeCluster) -> None:
    """A term's watch thread (app.kube.controllers) ends when the term's stop is set."""
    client = WatchedClient(kube_cluster.kubeconfig)
    label = uuid.uuid4().hex[:10]
    watch = ListWatch("pods", client, PODS, Seen(), watch_timeout=QUIET, labelSelector=f"q={label}")
    stop = Stop()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    assert watch.synced.wait(PATIENCE)
    assert client.watching.wait(PATIENCE)
    stop.set()
    thread.join(PATIENCE)
    assert not thread.is_alive(), "the list-watch did not end when stopped"
    assert watch.error is None
