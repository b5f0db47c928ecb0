"""Pods on managed nodes hold what they request, whichever scheduler bound them.

The watch selects bound, unfinished pods (``spec.nodeName!=``, phase not Succeeded or
Failed), so a pod that finishes or is deleted arrives as DELETED. It is released on proof
that its containers have stopped (app.core.pod_release), named in the release event; a
pod deleted while its node is NotReady (a lost kubelet) keeps its holding, an orphaned
holding, until its Node gets the out-of-service taint, is deleted or is Ready again
(discovery tells ``nodes_changed``; every sweep looks again too). A bound
pod the ledger does not know (default scheduler, DaemonSet controller) is recorded as it
is, even when it overcommits the node. A full resync compares every listed pod with the
ledger's pod holdings, read once, and records only the pods the ledger does not have as
they are, ``RECORD_BATCH`` per transaction (at 150,000 pods, one transaction per pod
would take minutes).

A sweep releases pod holdings whose pod is not bound anywhere once they are older than
``binding_grace`` (an admission's pod may not be bound yet), so holdings of pods deleted
while the service was down go too, by the same rule: one on a NotReady node is orphaned,
not released. After a resync it looks at every pod holding; the
periodic sweep (every second) only at those that came of age since the previous one: an
older holding was looked at then, and whatever happens to its pod later is an event.

Only ``PodInfo`` records and the set of present uids are kept, never pod objects.

A pod with DRA claims may hold GPUs its requests do not count: the devices the extender's
bind admitted from its claims. Its holding stands as it is when node, CPU and
memory agree; recording the pod's requests over it would drop those devices. A claim pod
the ledger does not hold (another scheduler bound it) is recorded with the co-managed GPUs
its claims were allocated (``claim_gpus``), so that they lower ``k8sgpu``; when they
cannot be read, it is recorded without them and read again every sweep until they are.
A plain GPU pod whose request kube-scheduler allocated through DRA (``PodInfo.extended_gpus``)
is such a claim pod: its GPUs are its generated claim's devices, counted once,
never fewer than it asked (its request counts them while they cannot be read).

A pod resized in place is an admission of what it grew by (Admissions.grow: checked, and
confirmed by Slurm); until then its holding stays the larger of the old one and what its
kubelet allocated (app.core.pods.resize), and a shrink is recorded at once. A growth that
does not fit gets a Warning Event on the pod (``RESIZE_NOT_ADMITTED``) and is tried again
by the sweep once its node's free room covers it, or at the pod's next change: with
placeholders on (app.core.placeholder), the kubelet defers the resize meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from app.admission.service import Admissions, ReleaseRequest
from app.core.claims import ClaimDevicesError
from app.core.ledger_errors import AdmissionRejected, HoldingNotFound, LedgerError, NodeNotFound
from app.core.pod_release import OUT_OF_SERVICE_TAINT, READY, NodeHealth, Proof, release_proof
from app.core.pods import PodInfo, PodShape, pod_info, resize
from app.core.presentation import describe_resources
from app.core.records import Holder, HolderKind, Holding, Placement, Recording
from app.core.resources import Resources
from app.ledger.service import Clock
from app.metrics.registry import NO_METRICS, Metrics

log = logging.getLogger(__name__)
FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
# Periodic sweeps overlap by this much: a holding stamped before its transaction committed
# is still looked at if the commit took less than this.
SWEEP_OVERLAP = timedelta(seconds=10)
RECORD_BATCH = 500
RESIZE_NOT_ADMITTED = "ResizeNotAdmitted"  # the reason of a refused growth's Event

# Posts a Warning Event on a pod: (pod, reason, message). Never raises.
Report = Callable[[PodInfo, str, str], None]


@dataclass(frozen=True, slots=True)
class _Refused:
    """A pod whose in-place growth was refused, as last seen, and what it grew by."""

    pod: PodInfo
    target: Resources
    growth: Resources


def _no_report(_pod: PodInfo, _reason: str, _message: str) -> None:
    pass


class PodAccounting:
    def __init__(
        self,
        admissions: Admissions,
        managed: Callable[[str], bool],
        *,
        gpu_resource: str,
        binding_grace: float,
        clock: Clock,
        claim_gpus: Callable[[PodInfo], int] | None = None,
        node_health: Callable[[str], NodeHealth | None] | None = None,
        metrics: Metrics = NO_METRICS,
        ignored: Callable[[PodInfo], bool] = lambda _pod: False,
        report: Report = _no_report,
    ) -> None:
        """``ignored``: pods that are not holders (the placeholder pods, which stand for
        the ledger's other holdings). ``claim_gpus``: the co-managed GPUs a bound pod's
        claims hold (app.kube.claims); None: GPU identity is off, claims count no GPU.
        ``node_health``: a managed Node's readiness and out-of-service taint, None for no
        such Node (NodeDiscovery.health); None: every managed node counts as Ready.
        ``report``: a Warning Event on a pod (a refused in-place growth)."""
        self.admissions = admissions
        self.report = report
        self._refused: dict[str, _Refused] = {}  # pods whose growth waits for room
        self.metrics = metrics
        self.ignored = ignored
        self.node_health = node_health or self._ready_if_managed
        self.claim_gpus = claim_gpus
        self._unread: dict[str, PodInfo] = {}  # claim pods recorded without their GPUs
        self.managed = managed
        self.gpu_resource = gpu_resource
        self.binding_grace = timedelta(seconds=binding_grace)
        self.clock = clock
        self._lock = threading.Lock()  # _present, _synced, _orphans
        self._present: set[str] = set()
        # Pod uid -> node of the holdings kept after their pod went (their node was lost).
        self._orphans: dict[str, str] = {}
        self._synced = False
        self._sweeping = threading.Lock()  # one sweep at a time; owns _swept_until
        self._swept_until: datetime | None = None  # older holdings were looked at

    # WatchHandler[PodInfo]
    shape = PodShape

    def decode(self, obj: dict[str, Any]) -> PodInfo:
        return pod_info(obj, self.gpu_resource)

    def key(self, pod: PodInfo) -> str:
        return pod.uid

    def resync(self, items: list[PodInfo]) -> None:
        pods = {p.uid: p for p in items if p.holds and not self.ignored(p)}
        with self._sweeping:
            cutoff = self.clock() - self.binding_grace
            with self._lock:
                self._present = set(pods)
                self._synced = True
                orphans = set(self._orphans)
            # One pass over the ledger's pod holdings, streamed: what is recorded as it is
            # needs nothing, what is old and not bound anywhere goes (or is orphaned).
            done: set[str] = set()
            resized: list[PodInfo] = []  # held on their node, as they were: one by one
            unbound: list[tuple[str, str]] = []
            for uid, placement in self.admissions.ledger.each_placement(HolderKind.POD):
                pod = pods.get(uid)
                orphans.discard(uid)
                if pod is not None and _recorded_as(placement, pod, self._counted(pod)):
                    done.add(uid)
                elif pod is not None and placement.node == pod.node:
                    done.add(uid)
                    resized.append(pod)
                elif pod is None and placement.created_at < cutoff:
                    unbound.append((uid, placement.node))
            self._forget_orphans(orphans)  # released meanwhile (through the REST API)
            missing = [
                self._recording(pod)
                for uid, pod in pods.items()
                if uid not in done and self._accountable(pod)
            ]
            del done
            for start in range(0, len(missing), RECORD_BATCH):
                self._record(missing[start : start + RECORD_BATCH])
            for pod in resized:
                self._hold(pod)
            self._release_unbound(unbound)
            self._swept_until = cutoff

    def on_event(self, kind: str, pod: PodInfo) -> None:
        if self.ignored(pod):
            return
        if kind == "DELETED" or not pod.holds:
            with self._lock:
                self._present.discard(pod.uid)
                self._unread.pop(pod.uid, None)
                self._refused.pop(pod.uid, None)
                proof = self._proof(pod, pod.uid, pod.node or "")
            if proof is not None:
                self._release(pod.uid, f"pod finished or deleted; proof: {proof}")
        else:
            with self._lock:
                self._present.add(pod.uid)
            self._hold(pod)

    def sweep(self) -> None:
        """Release pod holdings that came of age (older than the binding grace) since the
        last sweep and whose pod is not bound on any node, and orphaned holdings that have
        a proof now (one whose release failed is tried again)."""
        with self._sweeping:
            with self._lock:
                if not self._synced:
                    return
            cutoff = self.clock() - self.binding_grace
            since = None if self._swept_until is None else self._swept_until - SWEEP_OVERLAP
            aged = self.admissions.ledger.placements(
                HolderKind.POD, created_from=since, created_before=cutoff
            )
            self._release_unbound((uid, p.node) for uid, p in aged.items())
            self._swept_until = cutoff
            with self._lock:
                unread = list(self._unread.values())
                nodes = set(self._orphans.values())
                refused = list(self._refused.values())
            for pod in unread:
                self._hold(pod)
            for waiting in refused:
                if self._room_for(waiting):
                    self._hold(waiting.pod)
        self.nodes_changed(nodes)

    def _room_for(self, refused: _Refused) -> bool:
        """Whether a refused growth may fit now: its node's free room covers it (one read
        of the node; a try costs a Slurm push and its undo)."""
        try:
            view = self.admissions.ledger.get_node(refused.pod.node or "")
        except NodeNotFound:
            return False
        return view.not_admissible_reason is None and refused.growth.fits_within(view.free)

    def nodes_changed(self, names: Iterable[str]) -> None:
        """Discovery's hook: these Nodes' readiness or out-of-service taint changed, or
        they went. Release the orphaned holdings there that now have a proof."""
        names = set(names)
        with self._lock:
            due = [
                (uid, proof)
                for uid, node in self._orphans.items()
                if node in names and (proof := self._decide(None, uid, node)) is not None
            ]
        for uid, proof in due:
            self._release(uid, f"orphaned pod holding; proof: {proof}")

    def _release_unbound(self, placements: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            due = [
                (uid, proof)
                for uid, node in placements
                if uid not in self._present and (proof := self._proof(None, uid, node))
            ]
        for uid, proof in due:
            self._release(uid, f"no such bound pod; proof: {proof}")

    def _proof(self, pod: PodInfo | None, uid: str, node: str) -> Proof | None:
        """Under ``_lock``, so that nodes_changed cannot run between the decision and the
        orphaning: the proof that the holding of a pod gone (``pod``: as last seen, None:
        not listed) may go, or None: it is orphaned."""
        proof = self._decide(pod, uid, node)
        if proof is None and uid not in self._orphans:
            self._orphans[uid] = node
            self.metrics.kube_orphaned_pod_holdings(len(self._orphans))
            log.warning(
                "pod %s went while its node %s is not Ready: its holding stays until the Node "
                "is tainted %s, deleted, or Ready again",
                pod.display_name if pod else uid, node, OUT_OF_SERVICE_TAINT,
            )  # fmt: skip
        return proof

    def _decide(self, pod: PodInfo | None, uid: str, node: str) -> Proof | None:
        return release_proof(
            gone=True,
            terminal=pod is not None and pod.terminal,
            stopped=pod is not None and pod.stopped,
            node=self.node_health(node),
            orphaned=uid in self._orphans,
        )

    def _forget_orphans(self, uids: Iterable[str]) -> None:
        with self._lock:
            for uid in uids:
                self._orphans.pop(uid, None)
            self.metrics.kube_orphaned_pod_holdings(len(self._orphans))

    def _ready_if_managed(self, node: str) -> NodeHealth | None:
        return READY if self.managed(node) else None

    def _accountable(self, pod: PodInfo) -> bool:
        return pod.holds and pod.node is not None and self.managed(pod.node)

    def _hold(self, pod: PodInfo) -> None:
        if not self._accountable(pod):
            with self._lock:
                self._refused.pop(pod.uid, None)  # its node is not managed any more
            return
        with self._lock:
            unread = pod.uid in self._unread
        counted = self._counted(pod)
        if pod.claims and counted.gpus == 0 and not unread:
            for held in self.admissions.ledger.holdings_of(HolderKind.POD, [pod.uid]):
                placement = Placement(held.node, held.resources, held.created_at)
                if _recorded_as(placement, pod, counted):
                    return  # its claims' devices, held by the extender's bind, or counted
        entry = self._recording(pod)
        try:
            recorded = self.admissions.record(
                entry.node, entry.holder, entry.resources, reason="bound pod",
                allocated=pod.allocated,
            )  # fmt: skip
            self._grow(pod, recorded.holding, entry.resources)
        except LedgerError as exc:
            log.warning("recording pod %s on %s failed: %s", pod.display_name, pod.node, exc)

    def _grow(self, pod: PodInfo, holding: Holding, wanted: Resources) -> None:
        """Admit what the pod grew by beyond its holding (an in-place resize); refused, it
        waits (``_refused``) and its Event says why, once per size asked."""
        target = resize(holding.resources, wanted, pod.allocated).target
        if not target.fits_within(holding.resources):
            try:
                self.admissions.grow(holding, target)
            except AdmissionRejected as exc:
                self._refuse(pod, holding, target, exc.message)
                return
        with self._lock:
            self._refused.pop(pod.uid, None)

    def _refuse(self, pod: PodInfo, holding: Holding, target: Resources, why: str) -> None:
        growth = (target - holding.resources).at_least_zero()
        with self._lock:
            told = self._refused.get(pod.uid)
            self._refused[pod.uid] = _Refused(pod, target, growth)
        if told is not None and told.target == target:
            return
        message = (
            f"in-place resize to {describe_resources(target)} not admitted on node "
            f"{holding.node} (it holds {describe_resources(holding.resources)}): {why}"
        )
        log.info("pod %s: %s", pod.display_name, message)
        self.report(pod, RESIZE_NOT_ADMITTED, message)

    def _record(self, entries: list[Recording]) -> None:
        try:
            recorded = self.admissions.record_many(entries, reason="bound pod")
        except LedgerError as exc:
            log.warning("recording %d pods failed: %s", len(entries), exc)
            return
        for entry in recorded.unknown_node:  # the node left the ledger meanwhile
            log.warning("recording pod %s: no node %s", entry.holder.display_name, entry.node)

    def _release(self, uid: str, reason: str) -> None:
        with contextlib.suppress(HoldingNotFound):
            self.admissions.release(ReleaseRequest(uid, HolderKind.POD, reason, "kubernetes"))
        if uid in self._orphans:  # read without the lock: the lock-taking path is rare
            self._forget_orphans([uid])

    def _counted(self, pod: PodInfo) -> Resources:
        """What the pod's requests count: with GPU identity off, its GPU request too."""
        return pod.counted if self.claim_gpus is not None else pod.requests

    def _recording(self, pod: PodInfo) -> Recording:
        """The pod as the ledger records it: its requests, and for a claim pod whose requests
        count no GPU, the co-managed GPUs its claims hold (one API read per claim), never
        fewer than its GPU request (one its generated claim allocates: counted once)."""
        holder = Holder(HolderKind.POD, pod.uid, pod.display_name)
        resources = self._counted(pod)
        if self.claim_gpus is not None and pod.claims and resources.gpus == 0:
            gpus = pod.requests.gpus  # while its claims cannot be read: its request
            try:
                gpus = max(gpus, self.claim_gpus(pod))
            except ClaimDevicesError as exc:
                log.warning("pod %s: its GPUs not counted yet: %s", pod.display_name, exc)
                with self._lock:
                    self._unread[pod.uid] = pod
            else:
                with self._lock:
                    self._unread.pop(pod.uid, None)
            resources = replace(resources, gpus=gpus)
        return Recording(pod.node or "", holder, resources, pod.allocated)


def _recorded_as(placement: Placement | None, pod: PodInfo, counted: Resources) -> bool:
    """The ledger already holds exactly what this pod's requests count (``counted``) on its
    node, or for a pod with claims and no counted GPUs, its CPU and memory and the GPUs of
    its claims' devices."""
    if placement is None or placement.node != pod.node:
        return False
    if placement.resources == counted:
        return True
    held = replace(placement.resources, gpus=0)
    return pod.claims and counted.gpus == 0 and held == counted
