"""Whether this replica may still admit inside the nodes' grants without asking Slurm
(the headroom's fast path, app.core.headroom).

A grant is what a read-back showed Slurm withholding. It stays true only while Slurm keeps
the counts it was read with, and Slurm can change them without a push: a slurmctld restart
or reconfigure that restores older counts (no node_features plugin, or a kill -9 that lost
its last saved state), an administrator's ``scontrol update``. So the fast path is open only
while a witness holds: slurmctld's start time (``GET diag/``), read by the sync every step,
is the one every grant in the ledger was confirmed under, and the last such read is at most
``max_age`` old. Evidence that counts may have changed unseen (a new or unknown start time,
slurmrestd or slurmctld unreachable) puts the witness in *doubt*: the fast path closes at
once, and reopens only after the sync has voided every grant in the ledger (set to zero,
committed) and read an answering slurmctld again; a grant then rises only at a push's
read-back made after that.

What it cannot see: counts lost between two sync steps are trusted until the next step's
read (at most one interval plus a listing); docs/design.md#the-headroom-and-why-it-stays-safe
says what that leaves open.

Thread-safe: the sync's thread reads slurmctld and confirms; any thread (a push that found
slurmrestd away) may raise doubt. ``generation`` changes with every doubt, so a confirmation
computed before a doubt never clears it, and a push whose read-back came before a doubt
never raises a grant after it (app.slurm.push).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class SlurmWitness:
    def __init__(self, *, max_age: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.max_age = max_age
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._started: int | None = None  # slurmctld's start time the grants stand under
        self._checked_at: float | None = None
        # A new replica does not know what slurmctld did while none watched.
        self._doubt: str | None = "not checked since this service started"
        self._generation = 0

    @property
    def generation(self) -> int:
        with self._lock:
            return self._generation

    def trusted(self) -> bool:
        """Whether an admission inside a node's grant may skip Slurm now."""
        with self._lock:
            if self._doubt is not None or self._checked_at is None:
                return False
            return self.monotonic() - self._checked_at <= self.max_age

    def doubt(self, why: str) -> int:
        """Close the fast path until the grants are voided and slurmctld read again; the
        generation to pass to ``confirm`` once they are."""
        with self._lock:
            if self._doubt is None:
                log.info("admissions inside the headroom go through Slurm: %s", why)
            self._doubt = self._doubt or why
            self._generation += 1
            return self._generation

    def question(self, started: int) -> str | None:
        """Why the grants must be voided before ``started`` (slurmctld's start time, as read
        now) is trusted; None when they stand."""
        with self._lock:
            if self._doubt is not None:
                return self._doubt
            if started == 0:  # a reconfigure under way: statistics not yet started
                return "slurmctld reports no start time"
            if started != self._started:
                return "slurmctld restarted"
            return None

    def confirm(self, started: int, generation: int) -> None:
        """Trust ``started`` from now on, unless doubt came after ``generation`` (the grants
        were voided under it) or slurmctld reports no start time."""
        with self._lock:
            if generation != self._generation or started == 0:
                return
            if self._doubt is not None:
                log.info("admissions inside the headroom skip Slurm again")
            self._started, self._doubt = started, None
            self._checked_at = self.monotonic()
