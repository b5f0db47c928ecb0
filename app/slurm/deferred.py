"""Pushes off the caller's path: a headroom that ran low (an admission inside it left less
than its low-water mark) and, on nodes with a headroom, a release. One thread pushes the
nodes queued here, each once however many callers asked (the push withholds held +
target as the ledger is then, app.core.headroom). Deferring a release is safe: until the
push, Slurm withholds more than the ledger needs, never less. A push that fails leaves the
node owed to the Slurm sync (app.slurm.push), which pushes it at its next step."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.core.components import Health
from app.core.ledger_errors import NodeNotFound
from app.loops import Loop
from app.outages import log_failure
from app.slurm.push import Pusher

log = logging.getLogger(__name__)


class DeferredPushes:
    name = "deferred-pushes"

    def __init__(self, pusher: Pusher, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.pusher = pusher
        self.monotonic = monotonic
        # node -> (the first reason asked, when it is due): the earliest due pushed first.
        self._queued: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._loop = Loop(
            self.name, self._push_next, interval=None, logger=log, what="deferred pushes"
        )

    def defer_push(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        """Push ``node`` within ``settle`` seconds (sooner if asked so meanwhile), once."""
        due = self.monotonic() + settle
        with self._lock:
            queued = self._queued.get(node)
            if queued is None or due < queued[1]:
                self._queued[node] = (reason if queued is None else queued[0], due)
                self._loop.wake()

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(timeout=10)

    def health(self) -> Health:
        with self._lock:
            return Health("ok", f"{len(self._queued)} node(s) to push")

    def _push_next(self) -> float | None:
        """The loop's step: push the node due first if it is due; the seconds until the
        next one is (None: none queued, wait for a request)."""
        with self._lock:
            if not self._queued:
                return None
            node, (reason, due) = min(self._queued.items(), key=lambda item: item[1][1])
            wait = due - self.monotonic()
            if wait > 0:
                return wait
            del self._queued[node]
        try:
            self.pusher.push(node, reason=reason)
        except NodeNotFound:
            log.debug("%s was deleted before its push (%s)", node, reason)
        except Exception as exc:  # the sync pushes the node later; keep pushing others
            log_failure(log, f"pushing {node} ({reason}) failed", exc)
        return 0.0
