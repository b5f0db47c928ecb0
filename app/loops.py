"""Background work as one kind of loop: a daemon thread that calls a step, waits, and calls
it again until stopped. The step stays a plain method that tests call directly; ``Loop`` is
the thin shell around it (kopf's ``infinite_watch`` around ``continuous_watch``).

A step that raises is logged (``app.outages.log_failure``: a traceback for a bug, one DEBUG
line while a dependency is away) and the next one runs after ``interval``. A step returns
how long to wait before the next (None: ``interval``); ``wake()`` ends a wait early, for
work that arrives between steps.

``Stop`` is a ``threading.Event`` that also runs callbacks when set: a flag that a loop
checks between waits cannot end a read blocked on a socket, a callback that shuts the
socket can (app.kube.client's watch, as kopf closes its stream from a done-callback).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from app.outages import log_failure

log = logging.getLogger(__name__)


class Stop(threading.Event):
    """An Event whose ``set()`` also runs the callbacks registered with ``on_set``, each
    once, in the thread that sets it."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks_lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # the others still run, and whoever stops goes on stopping
                log.exception("a stop's callback failed")

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when set (at once if already set); returns what unregisters it."""
        with self._callbacks_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return lambda: self._unregister(callback)
        callback()
        return _nothing

    def _unregister(self, callback: Callable[[], None]) -> None:
        with self._callbacks_lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


def _nothing() -> None:
    pass


class Loop:
    """``step`` every ``interval`` seconds (None: only when woken) on a daemon thread named
    ``name``, from ``start()`` until ``stop()``: at once, or first after ``interval`` with
    ``wait_first``. A failed step is logged on ``logger`` as ``what``."""

    def __init__(
        self,
        name: str,
        step: Callable[[], float | None],
        *,
        interval: float | None,
        logger: logging.Logger,
        what: str,
        wait_first: bool = False,
    ) -> None:
        self.name = name
        self.step = step
        self.interval = interval
        self.logger = logger
        self.what = what
        self.wait_first = wait_first
        self._woken = threading.Event()
        self._stop = Stop()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # A new Stop per start: a thread of an earlier start that outlived its join (a
        # step still blocked) still ends, not resumes.
        self._stop = stop = Stop()
        self._thread = threading.Thread(target=self.run, args=(stop,), name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop, and wait up to ``timeout`` seconds for the step under way; whether the
        thread ended."""
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        if thread is not threading.current_thread():
            thread.join(timeout)
        return not thread.is_alive()

    def wake(self) -> None:
        """End the wait before the next step now (work came)."""
        self._woken.set()

    def run(self, stop: Stop) -> None:
        """The loop, on the calling thread, until ``stop`` is set (``start`` runs it on a
        thread of its own; a caller may run it in a thread it manages)."""
        self._woken.clear()
        unregister = stop.on_set(self._woken.set)  # a stop ends the wait at once
        try:
            wait = self.interval if self.wait_first else 0.0
            while not self._waited(stop, wait):
                try:
                    wait = self.step()
                except Exception as exc:  # keep going: the next step may succeed
                    log_failure(self.logger, self.what, exc)
                    wait = None
                if wait is None:
                    wait = self.interval
        finally:
            unregister()

    def _waited(self, stop: Stop, seconds: float | None) -> bool:
        """Wait ``seconds`` (None: until woken) or until woken; whether to stop now."""
        if stop.is_set():
            return True
        if seconds is None or seconds > 0:
            self._woken.wait(seconds)
        # Cleared before the step: work that arrives from now on wakes the next wait.
        self._woken.clear()
        return stop.is_set()
