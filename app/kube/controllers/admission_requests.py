"""The GenericNode admission-check protocol, for custom schedulers that cannot call an
extender: the scheduler appends {podUID, namespace, name, requests} to the GenericNode's
spec.admissionRequests; the service answers each in status.admissionChecks with Admitted
or Rejected and a message, through the same admission path as the extender and REST.
Answers for requests the scheduler removed are dropped. Of each GenericNode only its name,
requests and answers are kept (``Requests``), not the object."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, TypedDict

from app.admission.service import AdmissionRequest, Admissions
from app.core.errors import NodeledgerError
from app.core.genericnode import ADMITTED, REJECTED, timestamp
from app.core.quantities import cpu_millis, gpu_count, memory_bytes
from app.core.records import Holder, HolderKind
from app.core.resources import Resources
from app.kube.client import GENERICNODES, KubeClient
from app.ledger.service import Clock

log = logging.getLogger(__name__)


def requested(request: dict[str, Any], gpu_resource: str) -> Resources:
    amounts = request.get("requests") or {}
    return Resources(
        cpu_millis(amounts.get("cpu", 0)),
        memory_bytes(amounts.get("memory", 0)),
        gpu_count(amounts.get(gpu_resource, 0)),
    )


class _Meta(TypedDict, total=False):
    name: str


class _Spec(TypedDict, total=False):
    admissionRequests: list[dict[str, Any]]


class _Status(TypedDict, total=False):
    admissionChecks: list[dict[str, Any]]


class RequestsShape(TypedDict, total=False):
    """The fields of a GenericNode requests_of reads (a LIST parses only these)."""

    metadata: _Meta
    spec: _Spec
    status: _Status


@dataclass(frozen=True, slots=True)
class Requests:
    """A GenericNode's admission requests and the answers its status already has."""

    node: str
    asked: tuple[dict[str, Any], ...]
    answered: dict[str, dict[str, Any]]  # podUID -> check, in status order


def requests_of(obj: dict[str, Any]) -> Requests:
    asked = (obj.get("spec") or {}).get("admissionRequests") or []
    checks = (obj.get("status") or {}).get("admissionChecks") or []
    return Requests(
        obj["metadata"]["name"],
        tuple(r for r in asked if r.get("podUID")),
        {c.get("podUID"): c for c in checks},
    )


class AdmissionRequests:
    def __init__(
        self, admissions: Admissions, client: KubeClient, *, gpu_resource: str, clock: Clock
    ) -> None:
        self.admissions = admissions
        self.client = client
        self.gpu_resource = gpu_resource
        self.clock = clock

    # WatchHandler[Requests]
    shape = RequestsShape

    def decode(self, obj: dict[str, Any]) -> Requests:
        return requests_of(obj)

    def key(self, item: Requests) -> str:
        return item.node  # a GenericNode is named after its node

    def resync(self, items: list[Requests]) -> None:
        for item in items:
            self.answer(item)

    def on_event(self, kind: str, item: Requests) -> None:
        if kind != "DELETED":
            self.answer(item)

    def answer(self, item: Requests) -> None:
        node, answered = item.node, item.answered
        checks = [answered.get(r["podUID"]) or self._decide(node, r) for r in item.asked]
        if [c["podUID"] for c in checks] != list(answered):
            path = f"{GENERICNODES}/{node}"
            self.client.patch_status(path, {"admissionChecks": checks})

    def _decide(self, node: str, request: dict[str, Any]) -> dict[str, Any]:
        uid = str(request["podUID"])
        name = f"{request.get('namespace', '')}/{request.get('name', '')}".strip("/")
        try:
            self.admissions.admit(
                AdmissionRequest(
                    node,
                    Holder(HolderKind.POD, uid, name),
                    requested(request, self.gpu_resource),
                    path="genericnode",
                )
            )
            result, message = ADMITTED, f"admitted on {node}"
        except NodeledgerError as exc:
            result, message = REJECTED, str(exc)
        log.info("GenericNode %s: %s %s: %s", node, result.lower(), name or uid, message)
        return {
            "podUID": uid,
            "result": result,
            "message": message[:1024],
            "time": timestamp(self.clock()),
        }
