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
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def request(self, node: str, reason: str, *, settle: float = 0.0) -> None:
        due = self.monotonic() + settle
        with self._changed:
            queued = self._queued.get(node)
            if queued is None or due < queued[1]:
                self._queued[node] = (reason if queued is None else queued[0], due)
                self._changed.notify()

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def health(self) -> Health:
        with self._changed:
            return Health("ok", f"{len(self._queued)} node(s) to push")

    def _next(self) -> tuple[str, str] | None:
        """The next node due and its reason, once due; None when stopping."""
        with self._changed:
            while not self._stopping:
                if not self._queued:
                    self._changed.wait()
                    continue
                node, (reason, due) = min(self._queued.items(), key=lambda item: item[1][1])
                wait = due - self.monotonic()
                if wait <= 0:
                    del self._queued[node]
                    return node, reason
                self._changed.wait(wait)
            return None

    def _run(self) -> None:
        while (due := self._next()) is not None:
            node, reason = due
            try:
                self.pusher.push(node, reason=reason)
            except NodeNotFound:
                log.debug("%s was deleted before its push (%s)", node, reason)
            except Exception as exc:  # the sync pushes the node later; keep pushing others
                log_failure(log, f"pushing {node} ({reason}) failed", exc)
