"""Pods on managed nodes hold what they request, whichever scheduler bound them.

The watch selects bound, unfinished pods (``spec.nodeName!=``, phase not Succeeded or
Failed), so a pod that finishes or is deleted arrives as DELETED and is released. A bound
pod the ledger does not know (default scheduler, DaemonSet controller) is recorded as it
is, even when it overcommits the node. A full resync records every listed pod; a sweep
(after each resync, and every second) releases pod holdings whose pod is not bound
anywhere once they are older than ``binding_grace`` (an admission's pod may not be bound
yet), so holdings of pods deleted while the service was down go too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from app.admission.service import Admissions
from app.kube.pods import PodInfo, pod_info
from app.ledger.errors import HoldingNotFound, LedgerError
from app.ledger.records import Holder, HolderKind
from app.ledger.service import Clock

log = logging.getLogger(__name__)
FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


class PodAccounting:
    def __init__(
        self,
        admissions: Admissions,
        managed: Callable[[str], bool],
        *,
        gpu_resource: str,
        binding_grace: float,
        clock: Clock,
    ) -> None:
        self.admissions = admissions
        self.managed = managed
        self.gpu_resource = gpu_resource
        self.binding_grace = timedelta(seconds=binding_grace)
        self.clock = clock
        self._lock = threading.Lock()
        self._present: set[str] = set()
        self._synced = False

    def resync(self, items: list[dict[str, Any]]) -> None:
        pods = [pod_info(p, self.gpu_resource) for p in items]
        with self._lock:
            self._present = {p.uid for p in pods if p.holds}
            self._synced = True
        for pod in pods:
            self._hold(pod)
        self.sweep()

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        pod = pod_info(obj, self.gpu_resource)
        if kind == "DELETED" or not pod.holds:
            with self._lock:
                self._present.discard(pod.uid)
            self._release(pod.uid, "pod finished or deleted")
        else:
            with self._lock:
                self._present.add(pod.uid)
            self._hold(pod)

    def sweep(self) -> None:
        """Release pod holdings whose pod is not bound on any node, once they are older
        than the binding grace (called after each resync and periodically)."""
        with self._lock:
            if not self._synced:
                return
            present = set(self._present)
        oldest = self.clock() - self.binding_grace
        for holding in self.admissions.ledger.list_holdings(kind=HolderKind.POD):
            if holding.holder.id not in present and holding.created_at < oldest:
                self._release(holding.holder.id, "no such bound pod")

    def _hold(self, pod: PodInfo) -> None:
        if not pod.holds or pod.node is None or not self.managed(pod.node):
            return
        holder = Holder(HolderKind.POD, pod.uid, pod.display_name)
        try:
            self.admissions.record(pod.node, holder, pod.requests, reason="bound pod")
        except LedgerError as exc:
            log.warning("recording pod %s on %s failed: %s", pod.display_name, pod.node, exc)

    def _release(self, uid: str, reason: str) -> None:
        with contextlib.suppress(HoldingNotFound):
            self.admissions.release(uid, HolderKind.POD, reason=reason, path="kubernetes")
