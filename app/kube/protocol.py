"""The GenericNode admission-check protocol, for custom schedulers that cannot call an
extender: the scheduler appends {podUID, namespace, name, requests} to the GenericNode's
spec.admissionRequests; the service answers each in status.admissionChecks with Admitted
or Rejected and a message, through the same admission path as the extender and REST.
Answers for requests the scheduler removed are dropped."""

from __future__ import annotations

import logging
from typing import Any

from app.admission.service import Admissions
from app.kube.client import GENERICNODES, KubeClient
from app.kube.genericnode import ADMITTED, REJECTED, timestamp
from app.ledger.errors import LedgerError
from app.ledger.records import Holder, HolderKind
from app.ledger.resources import Resources
from app.ledger.service import Clock
from app.quantities import QuantityError, cpu_millis, gpu_count, memory_bytes

log = logging.getLogger(__name__)


def requested(request: dict[str, Any], gpu_resource: str) -> Resources:
    amounts = request.get("requests") or {}
    return Resources(
        cpu_millis(amounts.get("cpu", 0)),
        memory_bytes(amounts.get("memory", 0)),
        gpu_count(amounts.get(gpu_resource, 0)),
    )


class AdmissionRequests:
    def __init__(
        self, admissions: Admissions, client: KubeClient, *, gpu_resource: str, clock: Clock
    ) -> None:
        self.admissions = admissions
        self.client = client
        self.gpu_resource = gpu_resource
        self.clock = clock

    def resync(self, items: list[dict[str, Any]]) -> None:
        for obj in items:
            self.answer(obj)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self.answer(obj)

    def answer(self, obj: dict[str, Any]) -> None:
        node = obj["metadata"]["name"]
        asked = [
            r for r in (obj.get("spec") or {}).get("admissionRequests") or [] if r.get("podUID")
        ]
        answered = {
            c.get("podUID"): c for c in (obj.get("status") or {}).get("admissionChecks") or []
        }
        checks = [answered.get(r["podUID"]) or self._decide(node, r) for r in asked]
        if [c["podUID"] for c in checks] != list(answered):
            path = f"{GENERICNODES}/{node}"
            self.client.patch_status(path, {"admissionChecks": checks})

    def _decide(self, node: str, request: dict[str, Any]) -> dict[str, Any]:
        uid = str(request["podUID"])
        name = f"{request.get('namespace', '')}/{request.get('name', '')}".strip("/")
        try:
            self.admissions.admit(
                node,
                Holder(HolderKind.POD, uid, name),
                requested(request, self.gpu_resource),
                path="genericnode",
            )
            result, message = ADMITTED, f"admitted on {node}"
        except (LedgerError, QuantityError) as exc:
            result, message = REJECTED, str(exc)
        log.info("GenericNode %s: %s %s: %s", node, result.lower(), name or uid, message)
        return {
            "podUID": uid,
            "result": result,
            "message": message[:1024],
            "time": timestamp(self.clock()),
        }
