"""The kube-scheduler extender: filter and prioritize over the node snapshot (in memory,
app.ledger.snapshot), and bind through the one admission path (Slurm-confirmed), then
create the Binding. The wire types are in app.kube.extender.wire.

GPU devices: with co-managed DRA drivers configured, a pod with ResourceClaims
is admitted with the devices the scheduler allocated to them (app.kube.claims), and their
UUIDs where the slices publish them, which the gate holds in Slurm before the Binding is
created. A plain ``nvidia.com/gpu`` request that kube-scheduler allocated through DRA (the
claim it generated, KEP-5004) is held the same way, as those devices. Any doubt about them
refuses the bind: the scheduler then un-reserves the claims and tries again."""

from __future__ import annotations

import contextlib
import logging

from app.admission.service import AdmissionRequest, Admissions, ReleaseRequest
from app.core.caps import KubeCaps
from app.core.claims import gpus_counted_once, held_by_index
from app.core.errors import NodeledgerError
from app.core.ledger_errors import HoldingNotFound
from app.core.placement import filter_nodes, prioritize
from app.core.pods import pod_requests
from app.core.quantities import QuantityError
from app.core.records import HeldDevice, Holder, HolderKind
from app.kube.claims import PodDevices
from app.kube.client import KubeClient, KubeError
from app.kube.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
)
from app.ledger.snapshot import NodeSnapshot

log = logging.getLogger(__name__)


class Extender:
    def __init__(
        self,
        admissions: Admissions,
        client: KubeClient,
        caps: KubeCaps | None,
        *,
        gpu_resource: str,
        snapshot: NodeSnapshot,
        max_staleness: float = 0.0,
        devices: PodDevices | None = None,
    ) -> None:
        """``devices``: reads a pod's co-managed GPU devices from its claims;
        None: pods are admitted by their counted GPUs only."""
        self.admissions = admissions
        self.client = client
        self.caps = caps
        self.gpu_resource = gpu_resource
        self.snapshot = snapshot
        self.max_staleness = max_staleness
        self.devices = devices

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        try:
            requests = pod_requests(args.Pod.as_api_object(), self.gpu_resource)
        except QuantityError as exc:
            return ExtenderFilterResult(Error=f"invalid pod requests: {exc}")
        # Every change committed before this call (max_staleness 0), or up to
        # max_staleness seconds before, this replica's binds included: the scheduler's
        # own cache already counts the pods it placed, and bind admits through the
        # ledger (app.ledger.snapshot). Only the candidates are read.
        views = self.snapshot.views(self.max_staleness, own_writes=False)
        fits, failed = filter_nodes(requests, args.candidates, views, self.caps)
        # A scheduler without nodeCacheCapable sends Node objects and reads them back.
        nodes = args.Nodes.named(fits) if args.Nodes is not None else None
        return ExtenderFilterResult(Nodes=nodes, NodeNames=fits, FailedNodes=failed)

    def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        """(node, score) per candidate. Scores only order nodes that passed the filter, and
        bind admits through the ledger: they are read from the latest views, no refresh (a
        database round trip per scheduling cycle, after every bind of this replica)."""
        return prioritize(args.candidates, self.snapshot.latest())

    def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        name, namespace, uid, node = args.PodName, args.PodNamespace, args.PodUID, args.Node
        holder = Holder(HolderKind.POD, uid, f"{namespace}/{name}")
        try:
            pod = self.client.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
            if (pod.get("metadata") or {}).get("uid") != uid:
                replaced = f"pod {namespace}/{name} was replaced (uid changed)"
                return ExtenderBindingResult(Error=replaced)
            requests = pod_requests(pod, self.gpu_resource)
            devices: tuple[HeldDevice, ...] = ()
            if self.devices is not None:
                allocated = self.devices.of(pod, node)
                devices = held_by_index(allocated)
                requests = gpus_counted_once(requests, pod, allocated, devices, self.gpu_resource)
            admission = self.admissions.admit(
                AdmissionRequest(node, holder, requests, path="extender", devices=devices)
            )
        except NodeledgerError as exc:
            log.info("extender bind %s/%s on %s refused: %s", namespace, name, node, exc)
            return ExtenderBindingResult(Error=str(exc))
        try:
            self.client.bind(namespace, name, uid, node)
        except KubeError as exc:
            if admission.created:
                with contextlib.suppress(HoldingNotFound):
                    reason = f"binding failed: {exc}"
                    release = ReleaseRequest(uid, HolderKind.POD, reason, path="extender")
                    self.admissions.release(release)
            return ExtenderBindingResult(Error=f"binding failed: {exc}")
        return ExtenderBindingResult()
