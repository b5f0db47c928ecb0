"""Ledger -> Slurm: keep each node's k8scpu/k8smemory/k8sgpu counts (and the ``extra``
token the node_features plugin reads) equal to what the ledger withholds from Slurm.

Concurrency contract: a push is read-ledger -> update -> read-back while holding the
node against every replica (``Ledger.exclusive``, app.db.locks), so at most one push to a
node is in flight anywhere and each computes from the ledger as it is once it holds the
node: a late or repeated push can never restore stale counts, from this replica or
another. Within a replica pushes to a node are also coalesced: a caller whose ledger
change was committed before it called ``push`` returns as soon as any push that read the
ledger after that call has finished, so a burst of admissions on one node costs a few
updates, not one each.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from app.ledger.records import EventKind
from app.ledger.service import Ledger
from app.metrics.registry import NO_METRICS, Metrics
from app.slurm.client import SlurmClient
from app.slurm.counts import (
    K8sCounts,
    SlurmUnits,
    current_counts,
    desired_counts,
    extra_with_holdings,
    gres_update,
    withheld,
)
from app.slurm.models import SlurmNode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PushResult:
    node: SlurmNode  # as read back from Slurm after the push
    withheld: SlurmUnits  # what the push withheld from Slurm
    updated: bool  # False when Slurm already had the right counts
    drifted: bool  # Slurm had other counts than this service last pushed (reset behind us)


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requested: int = 0
    covered: int = 0  # every request numbered up to this is covered by a finished push
    last: PushResult | None = None
    pushed: K8sCounts | None = None  # what this process last pushed


class Pusher:
    def __init__(
        self, client: SlurmClient, ledger: Ledger, *, metrics: Metrics = NO_METRICS
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.metrics = metrics
        self._slots: dict[str, _Slot] = {}
        self._counter_lock = threading.Lock()

    def push(self, node: str, *, reason: str = "ledger changed") -> PushResult:
        with self._counter_lock:
            slot = self._slots.setdefault(node, _Slot())
            slot.requested += 1
            ticket = slot.requested
        with slot.lock:
            if slot.covered >= ticket and slot.last is not None:
                self.metrics.slurm_push_coalesced()
                return slot.last
            with self._counter_lock:
                start = slot.requested  # this push reads the ledger after all these requests
            self.metrics.slurm_pushed(reason)
            result = self._push_now(node, reason, slot.pushed)
            slot.covered, slot.last = start, result
            slot.pushed = current_counts(result.node)
            return result

    def _push_now(self, name: str, reason: str, pushed: K8sCounts | None) -> PushResult:
        with self.ledger.exclusive(name) as view:
            held = withheld(view)
            before = self.client.get_node(view.slurm_name)
            counts = desired_counts(before, held)
            extra = extra_with_holdings(before.extra, held)
            drifted = pushed is not None and current_counts(before) != pushed
            if current_counts(before) == counts and before.extra == extra:
                return PushResult(before, held, updated=False, drifted=drifted)
            gres = gres_update(before, counts)
            self.client.update_node(
                view.slurm_name, gres=gres, extra=extra if extra != before.extra else None
            )
            after = self.client.get_node(view.slurm_name)
        # Outside the lock: a push holds one database connection, never waits for another.
        self.ledger.record_event(
            EventKind.SLURM_PUSHED,
            name,
            f"pushed {gres} to Slurm node {view.slurm_name} ({reason})",
            {"gres": gres, "before": before.gres, "withheld": _units(held)},
        )
        log.debug("pushed %s to %s (%s)", gres, view.slurm_name, reason)
        return PushResult(after, held, updated=True, drifted=drifted)


def _units(held: SlurmUnits) -> dict[str, int]:
    return {"cpus": held.cpus, "memory_mb": held.memory_mb, "gpus": held.gpus}
