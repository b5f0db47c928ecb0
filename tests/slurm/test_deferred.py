"""Pushes off the caller's path (app.slurm.deferred): a node is pushed once however many
ask, a release's push waits for the rest of its burst, and a refill does not wait."""

from __future__ import annotations

import threading
import time

from app.slurm.deferred import DeferredPushes
from tests.support.realenv import wait_until

SETTLE = 120.0  # a release's settle that the refill must not wait for


class RecordingPusher:
    def __init__(self) -> None:
        self.pushed: list[tuple[str, str, float]] = []
        self.lock = threading.Lock()

    def push(self, node: str, *, reason: str) -> None:
        with self.lock:
            self.pushed.append((node, reason, time.monotonic()))


def test_a_burst_of_releases_is_one_push_after_it_settles() -> None:
    pusher = RecordingPusher()
    deferred = DeferredPushes(pusher)  # type: ignore[arg-type]
    deferred.start()
    try:
        asked = time.monotonic()
        for _ in range(20):
            deferred.defer_push("n1", "released", settle=0.3)
        deferred.defer_push("n2", "released", settle=0.3)
        wait_until(lambda: len(pusher.pushed) == 2, 30, what="both nodes pushed")
        time.sleep(0.4)
        assert sorted(node for node, _, _ in pusher.pushed) == ["n1", "n2"]
        assert all(at - asked >= 0.3 for _, _, at in pusher.pushed)
    finally:
        deferred.stop()


def test_a_refill_pushes_a_settling_node_at_once() -> None:
    pusher = RecordingPusher()
    deferred = DeferredPushes(pusher)  # type: ignore[arg-type]
    deferred.start()
    try:
        asked = time.monotonic()
        deferred.defer_push("n1", "released", settle=SETTLE)
        deferred.defer_push("n1", "headroom low")
        wait_until(lambda: len(pusher.pushed) == 1, SETTLE / 4, what="pushed")
        (node, reason, at) = pusher.pushed[0]
        assert (node, reason) == ("n1", "released")  # one push, for both
        assert at - asked < SETTLE / 4  # not after the settle: generous for a busy machine
    finally:
        deferred.stop()
