"""The kube-scheduler extender: filter and prioritize over a ledger snapshot, and bind
through the one admission path (Slurm-confirmed), then create the Binding.

Wire format (k8s.io/kube-scheduler/extender/v1, Go field names): ExtenderArgs {Pod,
Nodes, NodeNames}, ExtenderFilterResult {NodeNames, FailedNodes,
FailedAndUnresolvableNodes, Error}, HostPriorityList [{Host, Score}],
ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node}, ExtenderBindingResult {Error}.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from app.admission.service import Admissions
from app.kube.client import KubeClient, KubeError
from app.kube.extender import filter_nodes, prioritize
from app.kube.pods import pod_requests
from app.ledger.errors import HoldingNotFound, LedgerError
from app.ledger.records import Holder, HolderKind
from app.quantities import QuantityError
from app.slurm.policy import KubeCaps

log = logging.getLogger(__name__)


def _candidates(args: dict[str, Any]) -> list[str]:
    if args.get("NodeNames") is not None:
        return [str(n) for n in args["NodeNames"]]
    nodes = (args.get("Nodes") or {}).get("items") or []
    return [str(n["metadata"]["name"]) for n in nodes]


class Extender:
    def __init__(
        self,
        admissions: Admissions,
        client: KubeClient,
        caps: KubeCaps | None,
        *,
        gpu_resource: str,
    ) -> None:
        self.admissions = admissions
        self.client = client
        self.caps = caps
        self.gpu_resource = gpu_resource

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        candidates = _candidates(args)
        try:
            requests = pod_requests(args.get("Pod") or {}, self.gpu_resource)
        except QuantityError as exc:
            return {"NodeNames": [], "FailedNodes": {}, "Error": f"invalid pod requests: {exc}"}
        views = {v.name: v for v in self.admissions.ledger.list_nodes()}
        fits, failed = filter_nodes(requests, candidates, views, self.caps)
        return {
            "NodeNames": fits,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        views = {v.name: v for v in self.admissions.ledger.list_nodes()}
        return [{"Host": h, "Score": s} for h, s in prioritize(_candidates(args), views)]

    def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        name, namespace = str(args.get("PodName", "")), str(args.get("PodNamespace", ""))
        uid, node = str(args.get("PodUID", "")), str(args.get("Node", ""))
        holder = Holder(HolderKind.POD, uid, f"{namespace}/{name}")
        try:
            pod = self.client.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
            if pod["metadata"]["uid"] != uid:
                return {"Error": f"pod {namespace}/{name} was replaced (uid changed)"}
            admission = self.admissions.admit(node, holder, pod_requests(pod, self.gpu_resource))
        except (LedgerError, QuantityError, KubeError) as exc:
            log.info("extender bind %s/%s on %s refused: %s", namespace, name, node, exc)
            return {"Error": str(exc)}
        try:
            self.client.bind(namespace, name, uid, node)
        except KubeError as exc:
            if admission.created:
                with contextlib.suppress(HoldingNotFound):
                    self.admissions.release(uid, HolderKind.POD, reason=f"binding failed: {exc}")
            return {"Error": f"binding failed: {exc}"}
        return {"Error": ""}
