"""Refill a node's headroom off the admission path: an admission confirmed inside the
headroom that left it below its low-water mark queues the node here, and one thread
pushes it (the push withholds held + target again, app.core.headroom). Each node is
queued once however many admissions ask; a push that fails leaves the node owed to the
Slurm sync (app.slurm.push), which pushes it at its next step."""

from __future__ import annotations

import logging
import threading

from app.core.components import Health
from app.outages import log_failure
from app.slurm.push import Pusher

log = logging.getLogger(__name__)


class HeadroomRefill:
    name = "headroom-refill"

    def __init__(self, pusher: Pusher) -> None:
        self.pusher = pusher
        self._queued: dict[str, None] = {}  # an ordered set: first asked, first pushed
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def request(self, node: str) -> None:
        with self._changed:
            if node not in self._queued:
                self._queued[node] = None
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
            return Health("ok", f"{len(self._queued)} node(s) to refill")

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._queued and not self._stopping:
                    self._changed.wait()
                if self._stopping:
                    return
                node = next(iter(self._queued))
                del self._queued[node]
            try:
                self.pusher.push(node, reason="headroom low")
            except Exception as exc:  # the sync pushes the node later; keep refilling others
                log_failure(log, f"refilling the headroom of {node} failed", exc)
