"""kube-scheduler extender endpoints (filter, prioritize, bind): thin, the Extender decides.

Configure them in a KubeSchedulerConfiguration as
``urlPrefix: http://nodeledger:8080/v1/extender``, ``filterVerb: filter``,
``prioritizeVerb: prioritize``, ``bindVerb: bind``, ``nodeCacheCapable: true``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic_core import to_json

from app.auth.guard import body, require, require_read
from app.core.errors import NodeledgerError
from app.kube.extender.service import Extender
from app.kube.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
)

# Every route reads nodes (open unless NODELEDGER_AUTH_PROTECT_READS); bind is also a write.
router = APIRouter(
    prefix="/v1/extender",
    tags=["kube-scheduler extender"],
    dependencies=[require_read("get", "nodes")],
)


class KubeDisabled(NodeledgerError):
    """The extender's routes on a service that runs without the Kubernetes integration."""

    code = "kube_disabled"
    http_status = 404


async def _extender(request: Request) -> Extender:
    extender: Extender | None = request.app.state.services.extender
    if extender is None:
        raise KubeDisabled("the Kubernetes integration is not enabled (NODELEDGER_KUBE_ENABLED)")
    return extender


ExtenderDep = Annotated[Extender, Depends(_extender)]
JSON = "application/json"


# filter and prioritize run once per scheduling cycle, each with up to a thousand names:
# their answers are serialized here, once, and not validated again against the
# response_model (which documents them) nor passed through jsonable_encoder.


@router.post("/filter", response_model=ExtenderFilterResult)
def filter_nodes(args: ExtenderArgs, extender: ExtenderDep) -> Response:
    """ExtenderArgs in, ExtenderFilterResult out: the nodes that fit, reasons for the rest."""
    return Response(extender.filter(args).model_dump_json(), media_type=JSON)


@router.post("/prioritize", response_model=list[HostPriority])
def prioritize(args: ExtenderArgs, extender: ExtenderDep) -> Response:
    """HostPriorityList: prefer nodes where Slurm holds least, then the most free CPU."""
    scores = [{"Host": host, "Score": score} for host, score in extender.prioritize(args)]
    return Response(to_json(scores), media_type=JSON)


@router.post("/bind", dependencies=[require("create", "bindings", name=body("Node"))])
def bind(args: ExtenderBindingArgs, extender: ExtenderDep) -> ExtenderBindingResult:
    """Slurm-confirmed admission, then the Binding; an Error makes the scheduler retry."""
    return extender.bind(args)
